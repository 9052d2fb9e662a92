"""The `lance-cdf changes` command."""

import json
import os
import sys

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lance_cdf.cli import main


def table(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": [1, 2, 3], "s": ["a", "b", "c"]}), uri, enable_stable_row_ids=True
    )
    lance.dataset(uri).update({"s": "'z'"}, where="id = 2")
    lance.dataset(uri).delete("id = 3")
    return uri


def test_table_format_shows_updates_as_before_after(tmp_path, capsys):
    assert main(["changes", table(tmp_path), "--from", "2"]) == 0
    out = capsys.readouterr().out
    assert "b → z" in out and "delete" in out and "2 change(s)" in out


def test_jsonl_and_columns(tmp_path, capsys):
    assert (
        main(
            [
                "changes",
                table(tmp_path),
                "--from",
                "1",
                "--to",
                "2",
                "--format",
                "jsonl",
                "--columns",
                "s",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["_change_type"] for r in rows] == ["insert"] * 3 + [
        "update_preimage",
        "update_postimage",
    ]
    assert set(rows[0]) == {"s", "_rowid", "_change_type", "_commit_version", "_commit_timestamp"}


def test_parquet_output(tmp_path):
    out = str(tmp_path / "c.parquet")
    assert (
        main(["changes", table(tmp_path), "--from", "3", "--format", "parquet", "--output", out])
        == 0
    )
    assert pq.read_table(out)["_change_type"].to_pylist() == ["delete"]


def test_errors_exit_2_with_a_message(tmp_path, capsys):
    assert main(["changes", str(tmp_path / "nope.lance"), "--from", "1"]) == 2
    assert "no Lance table" in capsys.readouterr().err
    assert main(["changes", table(tmp_path), "--from", "1", "--format", "parquet"]) == 2
    assert "--output" in capsys.readouterr().err


def _jsonl(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_net_snapshot_and_drop_unchanged_flags(tmp_path, capsys):
    uri = table(tmp_path)  # v1 create, v2 update id 2, v3 delete id 3
    lance.dataset(uri).update({"s": "'y'"}, where="id = 2")  # v4: updated again
    lance.dataset(uri).update({"s": "s"}, where="id = 1")  # v5: rewritten, values unchanged
    assert main(["changes", uri, "--from", "2", "--format", "jsonl", "--net"]) == 0
    net = [(r["_change_type"], r["id"], r["s"]) for r in _jsonl(capsys)]
    assert net == [
        ("delete", 3, "c"),  # by the version of each row's last change
        ("update_preimage", 2, "b"),  # updated at v2 and v4: first preimage, last postimage
        ("update_postimage", 2, "y"),
        ("update_preimage", 1, "a"),  # the carry-over update of v5
        ("update_postimage", 1, "a"),
    ]
    argv = ["changes", uri, "--from", "5", "--format", "jsonl", "--drop-unchanged-updates"]
    assert main(argv) == 0
    assert _jsonl(capsys) == []
    assert main(["changes", uri, "--from", "5", "--format", "jsonl"]) == 0
    assert len(_jsonl(capsys)) == 2  # without the flag the carry-over pair is there
    assert main(["changes", uri, "--snapshot", "--from", "3", "--format", "jsonl"]) == 0
    rows = _jsonl(capsys)
    assert [(r["_change_type"], r["id"], r["s"]) for r in rows] == [
        ("snapshot", 1, "a"),
        ("snapshot", 2, "z"),
        ("update_preimage", 2, "z"),
        ("update_postimage", 2, "y"),
        ("update_preimage", 1, "a"),
        ("update_postimage", 1, "a"),
    ]
    assert {r["_commit_version"] for r in rows[:2]} == {3}
    assert main(["changes", uri, "--snapshot", "--format", "jsonl"]) == 0  # at the latest
    assert {r["_change_type"] for r in _jsonl(capsys)} == {"snapshot"}
    assert main(["changes", uri]) == 2
    assert "--from" in capsys.readouterr().err


@pytest.mark.parametrize(
    "given, spark",
    [
        ("500ms", "500 milliseconds"),
        ("2s", "2000 milliseconds"),
        ("1.5", "1500 milliseconds"),
        ("1 second", "1 second"),
        (" 10 seconds ", "10 seconds"),
    ],
)
def test_publish_trigger_interval_takes_replicate_style_durations(given, spark):
    from lance_cdf.cli import build_parser

    args = build_parser().parse_args(
        [
            "publish",
            "--table",
            "t",
            "--bootstrap-servers",
            "b",
            "--topic",
            "x",
            "--schema-registry",
            "r",
            "--checkpoint",
            "c",
            "--trigger-interval",
            given,
        ]
    )
    assert args.trigger_interval == spark


def test_publish_trigger_interval_rejects_nonsense(capsys):
    from lance_cdf.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(
            [
                "publish",
                "--table",
                "t",
                "--bootstrap-servers",
                "b",
                "--topic",
                "x",
                "--schema-registry",
                "r",
                "--checkpoint",
                "c",
                "--trigger-interval",
                "soon",
            ]
        )
    assert "not a duration" in capsys.readouterr().err


def test_the_command_names_where_a_native_crash_happened():
    """`lance-cdf` (entry) turns on faulthandler: a SIGSEGV leaves the Python stack on
    stderr (here raised where the command starts its work)."""
    import subprocess
    import sys

    code = (
        "import os, signal\n"
        "from lance_cdf import cli\n"
        "def crash(): os.kill(os.getpid(), signal.SIGSEGV)\n"
        "cli.malloc.keep_freed_memory_if_asked = crash\n"
        "cli.entry()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -11
    assert "Segmentation fault" in done.stderr
    assert "in crash" in done.stderr  # the stack, down to the frame that crashed


_ARENAS_PROBE = r"""
import ctypes, os, re, sys, tempfile, threading
from lance_cdf import cli

def arenas_after_threads():
    # 8 threads each allocate: glibc gives every new thread an arena of its own up to
    # its limit (8 per core), so the count shows the limit in force
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    started = threading.Barrier(8)
    def work():
        started.wait()
        for _ in range(200):
            libc.free(libc.malloc(4096))
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    path = os.path.join(tempfile.mkdtemp(), "info.xml")
    f = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, f)
    libc.fclose(f)
    print("arenas", len(re.findall(r'<heap nr="', open(path).read())))
    return 0

cli.main = arenas_after_threads
cli.entry()
"""


_MAPPED_PROBE = r"""
import ctypes
from lance_cdf.cli import replicate_command
from lance_cdf.ops import malloc

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

def mapped_by_a_2mib_block(args):
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(2 << 20)
    print("mapped", libc.mallinfo2().hblkhd - before)
    libc.free(block)
    return 0

malloc.keep_freed_memory()  # as `lance-cdf` (entry) does before any command
replicate_command._replicate = mapped_by_a_2mib_block
replicate_command.cmd_replicate(None)
"""


def _glibc_probe(code: str, variable: str, told: str | None, word: str) -> int:
    """The number `code` prints after `word`, run in a fresh Python with the environment
    `variable` unset (None) or set to `told`; glibc only."""
    import platform
    import subprocess

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    env = {k: v for k, v in os.environ.items() if k != variable}
    if told is not None:
        env[variable] = told
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split(word)[-1])


def test_the_replicator_maps_its_large_blocks_unless_told():
    """`lance-cdf replicate` serves blocks of 1 MiB and more from mappings of their own
    (freed to the kernel when freed: its compactions otherwise left its heap fragmented,
    BENCHMARKS "Soak"), over the raised thresholds the command's process starts with;
    LANCE_CDF_MALLOC_MMAP_THRESHOLD=0 leaves those (a 2 MiB block then comes from the heap)."""
    mapped = {
        told: _glibc_probe(_MAPPED_PROBE, "LANCE_CDF_MALLOC_MMAP_THRESHOLD", told, "mapped")
        for told in (None, "0")
    }
    assert mapped[None] >= 2 << 20, mapped
    assert mapped["0"] == 0, mapped  # the probe can tell


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's arenas")
def test_the_command_holds_glibc_to_two_arenas_unless_told():
    """`lance-cdf` (entry) bounds glibc's malloc arenas before its work starts (a replica's
    compaction otherwise left ~300 MB in its threads' arenas); LANCE_CDF_MALLOC_ARENAS=0
    leaves glibc's own limit, under which eight allocating threads make more."""
    counts = {
        told: _glibc_probe(_ARENAS_PROBE, "LANCE_CDF_MALLOC_ARENAS", told, "arenas")
        for told in (None, "0", "3")
    }
    assert counts[None] <= 2 and counts["3"] <= 3, counts
    assert counts["0"] > 3, counts  # the probe can tell
