"""The Dockerfiles and their ignore files keep their promises (there is no Docker engine here to build).

- the gateway's image is slim Python 3.11, runs as a fixed non-root UID (the one the Deployment
  names), and starts `aggregator serve`;
- nothing but the package's own sources enters its build context or image: no virtualenv,
  certificates, keys, caches or .git, and not the sample extension server (samples/wardle);
- the build stage's COPY + `pip install .`, replayed on exactly the context Docker would send,
  gives a working `aggregator` console script;
- the sample's image (samples/wardle/Dockerfile, with BuildKit's Dockerfile.dockerignore beside
  it) holds the sample and the gateway's libraries, and its replayed build gives a working
  `sample-apiserver` console script.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.manifests.k8s import MANIFESTS, REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
SAMPLE_DOCKERFILE = REPO / "samples" / "wardle" / "Dockerfile"
# BuildKit reads `<Dockerfile>.dockerignore` beside the Dockerfile instead of the context's own.
SAMPLE_DOCKERIGNORE = REPO / "samples" / "wardle" / "Dockerfile.dockerignore"


# --- a Dockerfile reader (instructions, stages, ARG substitution) -----------------------------------


@dataclass
class Instruction:
    keyword: str
    value: str


@dataclass
class Stage:
    image: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def read_instructions(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped, as Docker does
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, value = line.partition(" ")
        out.append(Instruction(keyword.upper(), value.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def read_stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for inst in read_instructions(text):
        if inst.keyword == "FROM":
            words = inst.value.split()
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(image, name))
        elif not stages:
            assert inst.keyword == "ARG", f"{inst.keyword} before the first FROM"
            key, _, default = inst.value.partition("=")
            args[key] = default
        else:
            stages[-1].instructions.append(inst)
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return read_stages(DOCKERFILE.read_text())[1]


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


def _copies(stage: Stage) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY that reads the build context (not --from)."""
    out = []
    for inst in stage.all("COPY"):
        words = shlex.split(inst.value)
        if any(w.startswith("--from") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        out.append((words[:-1], words[-1]))
    return out


def test_every_stage_is_slim_python_3_11(stages: list[Stage]) -> None:
    assert len(stages) >= 1
    for stage in stages:
        assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", stage.image), stage.image


def test_the_image_runs_as_the_fixed_non_root_user_the_deployment_names(final: Stage) -> None:
    (user,) = final.all("USER")
    uid, _, gid = user.value.partition(":")
    assert uid.isdigit() and gid.isdigit(), "USER must be numeric so runAsNonRoot can verify it"
    assert int(uid) != 0 and int(gid) != 0
    creates = " ".join(i.value for i in final.all("RUN"))
    assert f"--uid {uid}" in creates and f"--gid {gid}" in creates, "the user must exist in the image"
    for path in (MANIFESTS / "base/deployment.yaml", MANIFESTS / "examples/wardle/deployment.yaml"):
        pod = yaml.safe_load(path.read_text())["spec"]["template"]["spec"]
        ctx = pod["securityContext"]
        assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (int(uid), int(gid), int(gid)), path
    # USER comes last among the instructions that could need root.
    keywords = [i.keyword for i in final.instructions]
    assert "RUN" not in keywords[keywords.index("USER") :]


def test_the_entrypoint_is_aggregator_serve_in_exec_form(final: Stage) -> None:
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint.value) == ["aggregator", "serve"]
    assert not final.all("CMD"), "flags come from the Deployment's args"


def test_the_package_is_installed_with_pip_from_the_repository(stages: list[Stage]) -> None:
    """With the kube extra: the image runs in a cluster, and kube mode needs the kubernetes client."""
    runs = [i.value for s in stages for i in s.all("RUN")]
    # With the tracing extra too: --tracing-config-file works in the image.
    assert any(re.search(r"pip install (--\S+ )*'\.\[kube,tracing\]'$", run) for run in runs), runs


def test_nothing_but_the_package_sources_is_copied_and_no_secret_is_set(stages: list[Stage]) -> None:
    allowed = {"pyproject.toml", "README.md", "LICENSE", "setup.py", "native/", "aggregator/", "aggregator"}
    for stage in stages:
        assert not stage.all("ADD"), "ADD fetches URLs and unpacks archives: use COPY"
        for sources, _ in _copies(stage):
            assert set(sources) <= allowed, sources
        for inst in stage.all("ENV") + stage.all("ARG"):
            assert not re.search(r"(TOKEN|PASSWORD|SECRET|_KEY\b|CREDENTIAL)", inst.value, re.I), inst.value


# --- .dockerignore, with Docker's matching rules ------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's (moby/patternmatcher) syntax: `*` within a path element, `**` across elements."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def read_dockerignore(path: Path = DOCKERIGNORE) -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negated, _pattern_regex(pattern)))
    return rules


def excluded(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves `path` out of the context: the last pattern matching it, or one of its
    parent directories, decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for negated, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            result = not negated
    return result


def build_context(rules: list[tuple[bool, re.Pattern[str]]]) -> list[str]:
    """The files Docker would send from the repository (relative paths)."""
    files = []
    for root, dirs, names in os.walk(REPO):
        rel_root = os.path.relpath(root, REPO)
        rel_root = "" if rel_root == "." else rel_root + "/"
        # Never descend into the big ones; they are excluded whatever else the file says.
        dirs[:] = [d for d in dirs if d not in (".git", ".venv")]
        files += [rel_root + n for n in names if not excluded(rel_root + n, rules)]
    return sorted(files)


def test_dockerignore_keeps_out_environments_certificates_caches_and_git() -> None:
    rules = read_dockerignore()
    for path in (
        ".venv/bin/python",
        ".venv/lib/python3.11/site-packages/aiohttp/__init__.py",
        "certs/ca.key",
        "certs/admin.kubeconfig",
        "certs/front-proxy-client.crt",
        ".git/config",
        ".mypy_cache/3.11/x.json",
        ".ruff_cache/CACHEDIR.TAG",
        ".pytest_cache/v/cache",
        ".hypothesis/examples/x",
        "aggregator.egg-info/PKG-INFO",
        "aggregator/__pycache__/cli.cpython-311.pyc",
        "aggregator/tls/__pycache__/pem.cpython-311.pyc",
        "aggregator/commands/stray.key",
        "samples/wardle/sample_apiserver/server.py",
        "samples/wardle/pyproject.toml",
        "aggregator/stray.pem",
        "tests/conftest.py",
        "benchmarks/run_all.py",
        "manifests/base/deployment.yaml",
        "Dockerfile",
        "secret.env",
    ):
        assert excluded(path, rules), f"{path} would be sent to the Docker daemon"
    for path in ("pyproject.toml", "README.md", "aggregator/__init__.py", "aggregator/tls/pem.py"):
        assert not excluded(path, rules), f"{path} is needed to build the package"


def test_the_build_context_holds_every_package_file_and_nothing_else() -> None:
    context = build_context(read_dockerignore())
    # setup.py and native/: the compiled HTTP/2 header callback, built in the build stage.
    top = ("pyproject.toml", "README.md", "LICENSE", "setup.py")
    assert {*top, "native/h2blocks.c", "native/h2blocks_build.py"} <= set(context)
    assert all(p in top or p.startswith(("aggregator/", "native/")) for p in context), context
    package = {
        str(p.relative_to(REPO))
        for p in (REPO / "aggregator").rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        # what an editable install compiled into the tree: the build stage compiles its own
        and p.suffix not in (".pyc", ".key", ".pem", ".so")
    }
    assert package <= set(context)


def replay_copies(stage: Stage, context: list[str], root: Path) -> Path:
    """Run `stage`'s WORKDIR and context COPYs into `root` with Docker's rules; returns the WORKDIR."""
    (workdir,) = stage.all("WORKDIR")
    work = root / workdir.value.lstrip("/")
    work.mkdir(parents=True)
    for sources, destination in _copies(stage):
        dest = root / destination.lstrip("/") if destination.startswith("/") else work / destination
        for source in sources:
            name = source.rstrip("/")
            if (REPO / name).is_dir():  # a directory's contents go into dest
                members = [rel for rel in context if rel.startswith(name + "/")]
                assert members, f"COPY {source}: nothing of it is in the build context"
                pairs = [(rel, dest / rel[len(name) + 1 :]) for rel in members]
            else:
                assert name in context, f"COPY {source}: not in the build context"
                into_dir = destination.endswith("/") or len(sources) > 1
                pairs = [(name, dest / Path(name).name if into_dir else dest)]
            for rel, target in pairs:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, target)
    return work


def build_offline(project: Path, egg_base: Path, installed: Path) -> subprocess.CompletedProcess[str]:
    """What `pip install <project>` does, offline: setuptools' egg_info (entry points), build_py
    (the files a wheel would carry, package data included) and, where the project has a setup.py,
    build_ext (its compiled modules) into `installed`."""
    egg_base.mkdir(parents=True, exist_ok=True)
    setup = ["setup.py"] if (project / "setup.py").exists() else ["-c", "from setuptools import setup; setup()"]
    compiled = ["build_ext", "--build-lib", str(installed)] if setup == ["setup.py"] else []
    return subprocess.run(
        [
            sys.executable,
            *setup,
            "-q",
            "egg_info",
            "--egg-base",
            str(egg_base),
            "build_py",
            "--build-lib",
            str(installed),
            *compiled,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=project,
        check=False,
    )


def console_script(egg_info: Path, name: str) -> tuple[str, str]:
    """(module, function) of the console script `name` the egg-info declares."""
    entry_points = configparser.ConfigParser()
    entry_points.read(egg_info / "entry_points.txt")
    module, _, function = entry_points["console_scripts"][name].partition(":")
    return module, function


def run_console_script(
    module: str, function: str, name: str, args: list[str], pythonpath: list[Path], cwd: Path
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath)), "PYTHONDONTWRITEBYTECODE": "1"}
    code = (
        "import sys, importlib\n"
        f"main = getattr(importlib.import_module({module!r}), {function!r})\n"
        f"print(importlib.import_module({module.partition('.')[0]!r}).__file__, file=sys.stderr)\n"
        f"sys.argv[0] = {name!r}\n"
        "sys.exit(main())"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
        check=False,
    )


def test_the_build_stage_installs_a_working_console_script(tmp_path: Path, stages: list[Stage]) -> None:
    # Replay the build stage on the context Docker would send: its COPYs into the WORKDIR, then
    # what `pip install .` does there.
    context = build_context(read_dockerignore())
    build = next(s for s in stages if any("pip install" in r.value for r in s.all("RUN")))
    src = replay_copies(build, context, tmp_path / "build")
    installed = tmp_path / "site"
    result = build_offline(src, tmp_path, installed)
    assert result.returncode == 0, result.stderr
    (egg_info,) = tmp_path.glob("*.egg-info")
    # PEP 639 metadata, from the SPDX string and the full text shipped beside it (no deprecation).
    metadata = (egg_info / "PKG-INFO").read_text()
    assert "License-Expression: Apache-2.0\n" in metadata and "License-File: LICENSE\n" in metadata
    # The kube extra the image installs names the kubernetes client; nothing required names it.
    sections: dict[str, list[str]] = {"": []}
    section = ""
    for line in filter(None, (egg_info / "requires.txt").read_text().splitlines()):
        if line.startswith("["):
            section = line.strip("[]")
            sections[section] = []
        else:
            sections[section].append(line)
    assert [re.split(r"[<>=!~ ;]", r)[0] for r in sections["kube"]] == ["kubernetes"], sections
    assert not any(r.startswith("kubernetes") for name, rs in sections.items() if name != "kube" for r in rs)
    assert "deprecated" not in result.stderr, result.stderr
    assert (src / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    # What ENTRYPOINT ["aggregator", ...] runs.
    module, function = console_script(egg_info, "aggregator")
    run = run_console_script(module, function, "aggregator", ["serve", "--help"], [installed], tmp_path)
    assert run.returncode == 0, run.stderr
    assert "--proxy-client-cert-file" in run.stdout
    # It ran the copy built from the context, not the repository's package.
    assert run.stderr.strip().startswith(str(installed)), run.stderr
    for data in (REPO / "aggregator").rglob("*"):
        if data.suffix in (".json", ".yaml", ".typed") and "__pycache__" not in data.parts:
            assert (installed / data.relative_to(REPO)).exists(), f"{data} is missing from the image"
    # The compiled HTTP/2 header callback is built from the context (this machine has a compiler).
    assert list((installed / "aggregator/web/http2").glob("_h2blocks*.so")), "the header callback was not built"
    # The gateway's wheel holds the gateway: the sample server is a package of its own.
    assert sorted(p.name for p in installed.iterdir()) == ["aggregator"]


# --- the sample server's image ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_stages() -> list[Stage]:
    return read_stages(SAMPLE_DOCKERFILE.read_text())[1]


def test_the_sample_image_is_slim_python_run_by_the_user_its_deployment_names(
    sample_stages: list[Stage],
) -> None:
    assert all(re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", s.image) for s in sample_stages)
    final = sample_stages[-1]
    (user,) = final.all("USER")
    uid, _, gid = user.value.partition(":")
    pod = yaml.safe_load((MANIFESTS / "examples/wardle/deployment.yaml").read_text())["spec"]["template"]["spec"]
    ctx = pod["securityContext"]
    assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (int(uid), int(gid), int(gid))
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint.value) == ["sample-apiserver"]
    for stage in sample_stages:
        assert not stage.all("ADD")


def test_the_sample_context_holds_both_packages_and_nothing_else() -> None:
    rules = read_dockerignore(SAMPLE_DOCKERIGNORE)
    context = build_context(rules)
    assert "samples/wardle/sample_apiserver/server.py" in context
    assert "aggregator/runners/server.py" in context
    allowed = ("aggregator/", "samples/wardle/sample_apiserver/")
    top = ("pyproject.toml", "README.md", "LICENSE", "samples/wardle/pyproject.toml")
    assert all(p in top or p.startswith(allowed) for p in context), context
    for path in ("certs/ca.key", "samples/wardle/sample_apiserver/stray.key", ".venv/bin/python", "tests/conftest.py"):
        assert excluded(path, rules), path


def test_the_sample_build_installs_a_working_console_script(tmp_path: Path, sample_stages: list[Stage]) -> None:
    context = build_context(read_dockerignore(SAMPLE_DOCKERIGNORE))
    build = next(s for s in sample_stages if any("pip install" in r.value for r in s.all("RUN")))
    (install,) = [r.value for r in build.all("RUN") if "pip install" in r.value]
    assert install.split("pip install", 1)[1].split() == [".", "./samples/wardle"]
    src = replay_copies(build, context, tmp_path / "build")
    installed = tmp_path / "site"
    for project, egg_base in ((src, tmp_path / "gateway"), (src / "samples/wardle", tmp_path / "sample")):
        result = build_offline(project, egg_base, installed)
        assert result.returncode == 0, result.stderr
    (egg_info,) = (tmp_path / "sample").glob("*.egg-info")
    module, function = console_script(egg_info, "sample-apiserver")
    run = run_console_script(module, function, "sample-apiserver", ["--help"], [installed], tmp_path)
    assert run.returncode == 0, run.stderr
    assert "--requestheader-client-ca-file" in run.stdout
    assert run.stderr.strip().startswith(str(installed)), run.stderr
    assert sorted(p.name for p in installed.iterdir()) == ["aggregator", "sample_apiserver"]
