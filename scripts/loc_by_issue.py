"""Line counts of ``poprun_py/`` (its .py files) between two commits, and which issue's commits
the growth belongs to -- the evidence for issue 21's "poprun_py/ gets smaller" when later issues
added features in the same span.

Method (reproducible: only git and this file):

1. ``total``: the lines of every ``poprun_py/**/*.py`` file at BASE and at HEAD, per package
   (the first folder under ``poprun_py/``; the top-level modules as ``(top)``).
2. ``by issue``: every commit in ``BASE..HEAD`` (the history is linear) is given one issue: the
   first ``issue N`` its message names, else the first rule of :data:`RULES` whose pattern its
   message matches, else ``20`` (everyday correctness: the fixes with no other mark). Its net
   change of ``poprun_py/**/*.py`` lines (``git log --numstat``: added - deleted) counts for
   that issue. The nets add up to HEAD - BASE exactly.
3. ``same feature set``: BASE's lines plus issue 21's net -- what the refactor did to the code
   that existed at BASE, had no other issue written a line. A commit that mixes a refactor and
   a feature counts for one of them whole; ``--commits`` lists every commit's issue and net, so
   each assignment can be checked.
4. ``new feature files``: the files that did not exist at BASE and were created by a commit of
   another issue (per-node, k8s, OpenSSH, long runs, the CLI's look): a floor, by whole files,
   for the lines later features added.

Usage:

    python scripts/loc_by_issue.py [--base 5bdd021] [--head HEAD] [--commits]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess

# (issue, pattern): the first that matches a message without "issue N" decides
RULES: list[tuple[str, str]] = [
    ("20", r"^fix 7ed543c"),  # a fix of an issue-20 commit
    ("23", r"per-node|pernode|k8s|JobSet|NUMA node's memory|memory:|remote session can run over"),
    (
        "22",
        r"table style|one look|^views:|--format json|--version|duration|short flag|live status|"
        r"phases|golden text|plan prints|is named|exit codes 143|summary's detail|"
        r"--time also|^docs:|bold headers|failure line|within 100 columns|columns show",
    ),
    ("24", r"OpenSSH|openssh|ssh-client|1,024 hosts|4,0\d\d|64 hosts|connect window|KILL_WAIT"),
    ("24", r"pool\.release|auto no longer|auto's choice"),
    ("25", r"long runs|hang|spare|--check|min-progress|heartbeat|host-timeout|forward-signals"),
    ("25", r"^check:|failed check"),
    (
        "21",
        r"one registry|one builder|option catalog|option model|options as data|^layout:|"
        r"hostside|bundler|supervision: one core|shared core|transport seam|split along its seams|"
        r"typed|enums|^types:|BaseException|one explicit constructor|dead|^process: smaller|"
        r"re-exports|read-through|live beside the connections|one private-file writer|one wait|"
        r"one delete_tagged|_cluster|_Where|cluster_up|_MISSING|InstanceState|the one rule|"
        r"core data|SSH option group|registered backend|batch_script|BufferedStream|shortened|"
        r"agent_stream|settings_for|ssh settings: every path",
    ),
]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def py_files(rev: str) -> list[str]:
    names = git("ls-tree", "-r", "--name-only", rev, "poprun_py").split()
    return [n for n in names if n.endswith(".py")]


def package(path: str) -> str:
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else "(top)"


def lines_at(rev: str) -> dict[str, int]:
    """Lines of each poprun_py .py file at ``rev``."""
    return {f: git("show", f"{rev}:{f}").count("\n") for f in py_files(rev)}


def issue_of(message: str) -> str:
    m = re.search(r"issues? (\d+)", message)
    if m:
        return m.group(1)
    for issue, pattern in RULES:
        if re.search(pattern, message):
            return issue
    return "20"


def commits(base: str, head: str) -> list[tuple[str, str, int, dict[str, int]]]:
    """(hash, subject, net .py lines under poprun_py/, that net per package) for every commit
    in base..head."""
    out = git(
        "log",
        "--reverse",
        "--format=@%h %s",
        "--numstat",
        "--no-renames",
        f"{base}..{head}",
        "--",
        "poprun_py",
    )
    rows: list[tuple[str, str, int, dict[str, int]]] = []
    for line in out.splitlines():
        if line.startswith("@"):
            sha, _, subject = line[1:].partition(" ")
            rows.append((sha, subject, 0, collections.Counter()))
        elif line.strip():
            added, deleted, path = line.split("\t")
            if path.endswith(".py") and added != "-":
                sha, subject, net, where = rows[-1]
                where[package(path)] += int(added) - int(deleted)
                rows[-1] = (sha, subject, net + int(added) - int(deleted), where)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="5bdd021")
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("--commits", action="store_true", help="list every commit's issue")
    args = parser.parse_args()
    head = git("rev-parse", "--short", args.head).strip()
    before, after = lines_at(args.base), lines_at(head)
    print(
        f"poprun_py/**/*.py lines: {args.base} {sum(before.values())}, {head} {sum(after.values())}"
    )
    per: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for f, n in before.items():
        per[package(f)][0] += n
    for f, n in after.items():
        per[package(f)][1] += n
    print(f"  {'package':<12} {'before':>7} {'after':>7} {'change':>7}")
    for name, (b, a) in sorted(per.items()):
        print(f"  {name:<12} {b:>7} {a:>7} {a - b:>+7}")
    rows = commits(args.base, head)
    nets: dict[str, int] = collections.Counter()
    counts: dict[str, int] = collections.Counter()
    refactor: dict[str, int] = collections.Counter()
    for sha, subject, net, where in rows:
        issue = issue_of(subject)
        nets[issue] += net
        if issue == "21":
            refactor.update(where)
        counts[issue] += 1
        if args.commits:
            print(f"  {sha} issue {issue:>2} {net:>+6}  {subject[:90]}")
    print(f"net change by issue ({len(rows)} commits touching poprun_py/):")
    for issue in sorted(nets):
        print(f"  issue {issue}: {counts[issue]:>3} commits, net {nets[issue]:>+6}")
    print(
        f"  sum {sum(nets.values()):+} (HEAD - BASE {sum(after.values()) - sum(before.values()):+})"
    )
    same = sum(before.values()) + nets.get("21", 0)
    print(
        f"same feature set: {args.base} {sum(before.values())} -> {same} after issue 21's commits"
    )
    print(
        "  issue 21's net by package: "
        + ", ".join(f"{k} {v:+}" for k, v in sorted(refactor.items()))
    )
    created = {}
    for f in sorted(set(after) - set(before)):
        line = git("log", "--diff-filter=A", "--format=%s", "-1", head, "--", f).strip()
        created[f] = issue_of(line)
    for issue in sorted(set(created.values())):
        files = [f for f, i in created.items() if i == issue]
        total = sum(after[f] for f in files)
        print(f"new files created by issue {issue}'s commits: {len(files)}, {total} lines")
        if issue != "21":
            for f in files:
                print(f"    {after[f]:>5} {f}")


if __name__ == "__main__":
    main()
