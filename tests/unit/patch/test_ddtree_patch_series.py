"""series / SHA256SUMS parsing, fingerprints, and the repository's own patch directory."""

from __future__ import annotations

import pytest
from patchset_testlib import PATCH_DIR, load_filter_plugin, sha256

A = "a" * 64
B = "b" * 64


def test_parse_series_skips_comments_and_blanks(logic):
    text = "# header\n\n0001-x.patch\n  0002-y.patch   # trailing comment\n#0003-off.patch\n"
    assert logic.parse_series(text) == ["0001-x.patch", "0002-y.patch"]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("0001-x.patch -p0\n", "patch options are not supported"),
        ("0001-x.patch\n0001-x.patch\n", "listed twice"),
        ("../evil.patch\n", "invalid patch name"),
        ("sub/dir.patch\n", "invalid patch name"),
    ],
)
def test_parse_series_refuses_bad_lines(logic, text, fragment):
    with pytest.raises(logic.PatchSetError, match=fragment):
        logic.parse_series(text)


def test_parse_sha256sums_both_modes(logic):
    text = "%s  0001-x.patch\n%s *0002-y.patch\n\n# comment\n" % (A.upper(), B)
    assert logic.parse_sha256sums(text) == {"0001-x.patch": A, "0002-y.patch": B}


def test_parse_sha256sums_refuses_garbage(logic):
    with pytest.raises(logic.PatchSetError, match="line 1"):
        logic.parse_sha256sums("deadbeef  0001-x.patch\n")


def test_fingerprint_is_short_stable_and_order_sensitive(logic):
    entries = [{"name": "0001-x.patch", "sha256": A}, {"name": "0002-y.patch", "sha256": B}]
    short = logic.patchset_fingerprint(entries)
    assert len(short) == logic.FINGERPRINT_LENGTH == 12
    assert all(c in "0123456789abcdef" for c in short)
    assert logic.patchset_fingerprint_full(entries).startswith(short)
    # same list as pairs, upper-case digests -> same value
    assert logic.patchset_fingerprint([("0001-x.patch", A.upper()), ("0002-y.patch", B)]) == short
    assert logic.patchset_fingerprint(list(reversed(entries))) != short
    assert logic.patchset_fingerprint([entries[0]]) != short
    assert logic.patchset_fingerprint([{"name": "0001-x.patch", "sha256": B}, entries[1]]) != short


def test_fingerprint_of_empty_set(logic):
    assert logic.patchset_fingerprint([]) == logic.NOPATCH_FINGERPRINT == "nopatch"
    assert logic.patchset_fingerprint(None) == "nopatch"


@pytest.mark.parametrize(
    "entries",
    [
        [{"name": "x.patch"}],
        [{"name": "x.patch", "sha256": "1234"}],
        [{"name": "x.patch", "sha256": A}, {"name": "x.patch", "sha256": B}],
        ["x.patch"],
    ],
)
def test_fingerprint_refuses_bad_entries(logic, entries):
    with pytest.raises(logic.PatchSetError):
        logic.patchset_fingerprint(entries)


def test_patch_targets_strip_one_component(logic, tree):
    assert logic.patch_targets(tree.p2.read_text()) == ["sglang/srt/algo.py", "sglang/srt/utils.py"]


def test_patch_targets_refuse_escaping_paths(logic):
    text = "--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-x\n+y\n"
    with pytest.raises(logic.PatchSetError, match="escapes"):
        logic.patch_targets(text)


# ---- the repository's patch directory -------------------------------------------------------


def test_repo_series_matches_sha256sums():
    from ansible_collections.ddtree.fleet.plugins.module_utils.patch import series as ddtree_patch

    names = ddtree_patch.parse_series((PATCH_DIR / "series").read_text())
    sums = ddtree_patch.parse_sha256sums((PATCH_DIR / "SHA256SUMS").read_text())
    assert names == [
        "0001-ddtree-register-algorithm.patch",
        "0002-ddtree-dflash-family.patch",
        "0003-ddtree-tree.patch",
        "0004-ddtree-worker.patch",
    ]
    assert sorted(sums) == sorted(names), "SHA256SUMS must list exactly the patches in series"
    for name in names:
        assert sums[name] == sha256(PATCH_DIR / name), "%s changed: regenerate SHA256SUMS" % name


def test_repo_patches_use_site_packages_paths():
    from ansible_collections.ddtree.fleet.plugins.module_utils.patch import series as ddtree_patch

    for name in ddtree_patch.parse_series((PATCH_DIR / "series").read_text()):
        text = (PATCH_DIR / name).read_text()
        targets = ddtree_patch.patch_targets(text)
        assert targets and all(t.startswith("sglang/srt/") for t in targets), targets
        lines = text.splitlines()
        for index, line in enumerate(lines):
            if line.startswith("--- /dev/null"):  # a new file: only as "--- /dev/null" + "+++ b/..."
                if not (index + 1 < len(lines) and lines[index + 1].startswith("+++ b/")):
                    pytest.fail("%s: /dev/null header without a '+++ b/' line: %r" % (name, line))
                continue
            if line.startswith("--- ") and not line.startswith("--- a/"):
                pytest.fail("%s: unexpected header %r" % (name, line))
            if line.startswith("+++ ") and not line.startswith("+++ b/"):
                pytest.fail("%s: unexpected header %r" % (name, line))


# The incident's half-patched state (0001 alone) and the DFLASH-family wiring (0002) must stay
# reproducible: later work goes into new patches, these two keep their bytes.
PINNED = {
    "0001-ddtree-register-algorithm.patch": "11721fd8da78fa43088a46c2ef259420e09c7195cee7f1e73959266468f6cc0c",
    "0002-ddtree-dflash-family.patch": "427e240679a1228ed2200f66f6e85da0539a97d0978ce842c0e07b89cc657f66",
}


def test_0001_and_0002_keep_their_bytes():
    for name, digest in PINNED.items():
        assert sha256(PATCH_DIR / name) == digest, "%s changed; add a new patch instead" % name


def test_0003_only_creates_ddtree_tree():
    from ansible_collections.ddtree.fleet.plugins.module_utils.patch import series as ddtree_patch

    text = (PATCH_DIR / "0003-ddtree-tree.patch").read_text()
    assert ddtree_patch.patch_targets(text) == ["sglang/srt/speculative/ddtree_tree.py"]
    headers = [line for line in text.splitlines() if line.startswith(("--- ", "+++ ", "@@ "))]
    assert headers[:2] == ["--- /dev/null", "+++ b/sglang/srt/speculative/ddtree_tree.py"]
    assert len(headers) == 3 and headers[2].startswith("@@ -0,0 +1,"), headers


def test_0001_only_touches_spec_info():
    from ansible_collections.ddtree.fleet.plugins.module_utils.patch import series as ddtree_patch

    text = (PATCH_DIR / "0001-ddtree-register-algorithm.patch").read_text()
    assert ddtree_patch.patch_targets(text) == ["sglang/srt/speculative/spec_info.py"]


# ---- controller-side filter plugin ----------------------------------------------------------


def test_filter_plugin_uses_the_same_fingerprint(logic):
    plugin = load_filter_plugin()
    filters = plugin.FilterModule().filters()
    entries = [{"name": "0001-x.patch", "sha256": A}, {"name": "0002-y.patch", "sha256": B}]
    assert filters["patchset_fingerprint"](entries) == logic.patchset_fingerprint(entries)
    assert filters["patchset_fingerprint"]([]) == "nopatch"
    assert filters["patchset_fingerprint"](entries, 20) == logic.patchset_fingerprint_full(entries)[:20]


def test_filter_plugin_plans_the_repo_patch_set(logic):
    plugin = load_filter_plugin()
    filters = plugin.FilterModule().filters()
    names = logic.parse_series((PATCH_DIR / "series").read_text())
    plan = filters["patch_plan"]((PATCH_DIR / "series").read_text(), (PATCH_DIR / "SHA256SUMS").read_text(),
                                        list(reversed(names)), [], str(PATCH_DIR))
    assert [e["name"] for e in plan] == names == [
        "0001-ddtree-register-algorithm.patch", "0002-ddtree-dflash-family.patch", "0003-ddtree-tree.patch",
            "0004-ddtree-worker.patch"]
    assert [e["src"] for e in plan] == [f"{PATCH_DIR}/{n}" for n in names]
    assert filters["patchset_fingerprint"](plan) == logic.patchset_fingerprint(
        [(n, sha256(PATCH_DIR / n)) for n in names]
    )


def test_select_patches_orders_by_series_and_appends_user_patches(logic):
    series = "# comment\n0001-a.patch\n0002-b.patch\n"
    sums = f"{A}  0001-a.patch\n{B}  0002-b.patch\n"
    plan = logic.select_patches(series, sums, ["0002-b.patch", "0001-a.patch"],
                                [{"path": "/x/9-mine.patch", "sha256": "C" * 64}], "/p")
    assert [p["name"] for p in plan] == ["0001-a.patch", "0002-b.patch", "9-mine.patch"]
    assert plan[0] == {"name": "0001-a.patch", "src": "/p/0001-a.patch", "sha256": A}
    assert plan[2] == {"name": "9-mine.patch", "src": "/x/9-mine.patch", "sha256": "c" * 64}
    assert logic.select_patches(series, sums, [], [], "/p") == []


@pytest.mark.parametrize("series,sums,selected,extras,fragment", [
    ("0001-a.patch\n", f"{A}  0001-a.patch\n", ["0003-c.patch"], [], "sglang_patches: unknown patch '0003-c.patch'"),
    ("0001-a.patch\n0002-b.patch\n", f"{A}  0001-a.patch\n", ["0002-b.patch"], [], "0002-b.patch has no checksum"),
    ("0001-a.patch\n", "", [], [{"path": "/x/y.patch", "sha256": "short"}], r"sglang_extra_patches\[0\]: expected"),
    ("0001-a.patch\n", f"{A}  0001-a.patch\n", ["0001-a.patch"], [{"path": "/x/0001-a.patch", "sha256": B}],
     r"sglang_extra_patches\[0\]: a patch named 0001-a.patch is already"),
    # The series and SHA256SUMS are read strictly: the one parser the module uses too.
    ("0001-a.patch -p0\n", "", [], [], "patch options are not supported"),
    ("0001-a.patch\n", "deadbeef  0001-a.patch\n", [], [], "is not '<sha256>  <name>'"),
])
def test_select_patches_refuses_bad_input(logic, series, sums, selected, extras, fragment):
    with pytest.raises(logic.PatchSetError, match=fragment):
        logic.select_patches(series, sums, selected, extras, "/p")


def test_filter_plugin_errors_are_filter_errors():
    from ansible.errors import AnsibleFilterError

    plugin = load_filter_plugin()
    filters = plugin.FilterModule().filters()
    with pytest.raises(AnsibleFilterError, match="sha256"):
        filters["patchset_fingerprint"]([{"name": "x.patch", "sha256": "nope"}])
    with pytest.raises(AnsibleFilterError, match="patch_plan: sglang_patches: unknown patch"):
        filters["patch_plan"]("0001-a.patch\n", "", ["x.patch"], [], "/p")
