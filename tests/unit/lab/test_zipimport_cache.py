"""The lab image's bytecode cache for zip imports (lab/image/zipimport_cache.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

HOOK = Path(__file__).resolve().parents[3] / "lab" / "image" / "zipimport_cache.py"

SOURCE = '''
def inner():
    raise RuntimeError("boom")

class K:
    def m(self):
        return inner()

VALUE = 42
'''

RUN = '''
import sys, traceback
exec(open(sys.argv[1]).read(), {"__name__": "ddtree_lab_zipimport_cache"})
sys.path.insert(0, sys.argv[2])
import zmod
print(zmod.VALUE)
try:
    zmod.K().m()
except RuntimeError:
    tb = traceback.extract_tb(sys.exc_info()[2])
    print(tb[-1].filename)
'''


def run(tmp_path: Path, cache: Path, archive: Path) -> list[str]:
    res = subprocess.run([sys.executable, "-c", RUN, str(HOOK), str(archive)],
                         env={"DDTREE_LAB_ZIPIMPORT_CACHE": str(cache), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30, check=True)
    return res.stdout.split()


def make_zip(path: Path, source: str) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("zmod.py", source)
    return path


def test_the_second_import_uses_the_cache_and_tracebacks_name_the_new_archive(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    first = make_zip(tmp_path / "a.zip", SOURCE)
    assert run(tmp_path, cache, first) == ["42", f"{first}/zmod.py"]
    entries = list(cache.iterdir())
    assert len(entries) == 1
    # Another archive with the same source: served from the cache (made unreadable as source
    # proof: the cached code's constant differs), and its file names point at the new archive.
    import marshal
    code = marshal.loads(entries[0].read_bytes())
    entries[0].write_bytes(marshal.dumps(compile(SOURCE.replace("42", "43"), "x", "exec")))
    second = make_zip(tmp_path / "b.zip", SOURCE)
    assert code.co_filename == f"{first}/zmod.py"
    assert run(tmp_path, cache, second) == ["43", f"{second}/zmod.py"]


def test_a_changed_source_is_compiled_and_a_broken_entry_is_replaced(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    assert run(tmp_path, cache, make_zip(tmp_path / "a.zip", SOURCE))[0] == "42"
    assert run(tmp_path, cache, make_zip(tmp_path / "b.zip", SOURCE.replace("42", "7")))[0] == "7"
    assert len(list(cache.iterdir())) == 2
    for entry in cache.iterdir():
        entry.write_bytes(b"not marshal data")
    assert run(tmp_path, cache, make_zip(tmp_path / "c.zip", SOURCE))[0] == "42"


def test_without_the_cache_directory_nothing_is_written(tmp_path):
    cache = tmp_path / "absent"
    assert run(tmp_path, cache, make_zip(tmp_path / "a.zip", SOURCE))[0] == "42"
    assert not cache.exists()
