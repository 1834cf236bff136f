"""Lab hosts only: a bytecode cache for code that Python imports from zip archives.

Installed into the lab's base image (labctl `customize`) as a .pth-loaded module. Ansible runs
every module from a fresh zip (AnsiballZ) whose sources carry no bytecode, so every task compiles
ansible.module_utils again: on a lab host that is about a fifth of a trivial task's wall time.
Keyed by the interpreter's magic number and the source's digest, compiled code is kept in
_DIR and reused; file names are set back to the archive's, so tracebacks read as without it.
Any error reading or writing the cache falls back to compiling. Without _DIR it does nothing.
"""
import marshal
import os
import zipimport

_DIR = os.environ.get("DDTREE_LAB_ZIPIMPORT_CACHE", "/var/cache/ddtree-lab/zipimport-pyc")
_compile = zipimport._compile_source
_CODE = type(_compile.__code__)


def _retarget(code, filename):
    consts = tuple(_retarget(c, filename) if isinstance(c, _CODE) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _compile_cached(pathname, source):
    import hashlib
    from importlib.util import MAGIC_NUMBER
    key = hashlib.sha256(MAGIC_NUMBER + source).hexdigest()
    path = os.path.join(_DIR, key)
    try:
        with open(path, "rb") as f:
            return _retarget(marshal.load(f), pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile(pathname, source)
    try:
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "wb") as f:
            marshal.dump(code, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return code


if os.path.isdir(_DIR):
    zipimport._compile_source = _compile_cached
