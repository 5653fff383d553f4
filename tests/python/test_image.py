"""The container image's recipe (CI cannot build images here, so its structure is checked).

Parses Dockerfile and .dockerignore: a multi-stage build whose build stage runs a locked
release build and whose runtime stage is distroless or slim, runs as a numeric non-root user,
copies only the binary from the build stage, exposes 9010 and 9011 and enters `ditto serve`;
every path the build stage copies exists and survives .dockerignore, and the runtime's
binary path is the entrypoint's.
"""

import fnmatch
import json
import os
import re

from conftest import ROOT


def instructions(text):
    """(KEYWORD, arguments) pairs with comments dropped and continuations joined."""
    joined, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        joined.append(current)
        current = ""
    assert not current, "the Dockerfile ends inside a continuation"
    parsed = []
    for line in joined:
        keyword, _, rest = line.partition(" ")
        parsed.append((keyword.upper(), rest.strip()))
    return parsed


def stages(parsed):
    """[(FROM arguments, [instructions])] per stage."""
    result = []
    for keyword, rest in parsed:
        if keyword == "FROM":
            result.append((rest, []))
        elif result:
            result[-1][1].append((keyword, rest))
        else:
            assert keyword == "ARG", f"{keyword} before the first FROM"
    return result


def allowed(path, patterns):
    """Whether .dockerignore lets `path` into the build context (last match wins)."""
    keep = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            keep = negate
    return keep


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
        return handle.read()


def test_the_dockerfile_builds_a_non_root_distroless_ditto_serve_image():
    built = stages(instructions(read("Dockerfile")))
    assert len(built) >= 2, "multi-stage"
    (build_from, build_steps), (runtime_from, runtime_steps) = built[0], built[-1]
    assert build_from.endswith(" AS build"), build_from
    assert any(
        keyword == "RUN" and "cargo build --release --locked" in rest for keyword, rest in build_steps
    ), build_steps
    image = runtime_from.split()[0]
    assert "distroless" in image or "slim" in image, image

    users = [rest for keyword, rest in runtime_steps if keyword == "USER"]
    assert users, "the runtime stage sets USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) > 0), users[-1]

    exposed = {port for keyword, rest in runtime_steps if keyword == "EXPOSE" for port in rest.split()}
    assert {"9010", "9011"} <= exposed, exposed

    entrypoints = [json.loads(rest) for keyword, rest in runtime_steps if keyword == "ENTRYPOINT"]
    assert entrypoints, "exec-form ENTRYPOINT"
    binary, command = entrypoints[-1]
    assert os.path.basename(binary) == "ditto" and command == "serve", entrypoints[-1]

    copies = [rest.split() for keyword, rest in runtime_steps if keyword in ("COPY", "ADD")]
    assert len(copies) == 1, f"the runtime stage copies only the binary: {copies}"
    assert copies[0][0] == "--from=build" and copies[0][-1] == binary, copies


def test_the_build_context_holds_what_the_build_copies():
    patterns = [
        line.strip() for line in read(".dockerignore").splitlines() if line.strip() and not line.startswith("#")
    ]
    for never in ("target", ".venv", ".git", "tests/python"):
        assert not allowed(never, patterns), f"{never} must stay out of the build context"
    build_steps = stages(instructions(read("Dockerfile")))[0][1]
    for keyword, rest in build_steps:
        if keyword != "COPY":
            continue
        sources = [word for word in rest.split()[:-1] if not word.startswith("--")]
        for source in sources:
            assert os.path.exists(os.path.join(ROOT, source)), source
            assert allowed(source, patterns), f"{source} is excluded by .dockerignore"
    # The crate's own inputs (build script, embedded data) are all in the context.
    for needed in ("Cargo.toml", "Cargo.lock", "build.rs", "src/main.rs", "proto/ditto/v1", "data/clusters"):
        assert allowed(needed, patterns), needed
    embedded = []
    for directory, _, files in os.walk(os.path.join(ROOT, "src")):
        for name in files:
            if name.endswith(".rs"):
                with open(os.path.join(directory, name), encoding="utf-8") as handle:
                    for source in re.findall(r'include_(?:str|bytes)!\("((?:\.\./)+[^"]+)"\)', handle.read()):
                        embedded.append(os.path.relpath(os.path.normpath(os.path.join(directory, source)), ROOT))
    assert embedded, "the binary embeds its data"
    for source in embedded:
        assert allowed(source, patterns), f"{source} (embedded) is excluded by .dockerignore"
