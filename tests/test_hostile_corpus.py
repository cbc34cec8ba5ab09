"""The hostile-input corpus: what a careless or hostile user may hand edgeopt, each case run through the CLI.

Every case asserts: the exit code; one line on stderr, ``edgeopt: ...`` (or ``edgeopt-device: ...``), no
traceback and no "internal error"; nothing left in the temporary folder or beside ``--out``; every file
already there (a previous edgeopt output, a user's folder) byte-identical. Cases run in-process (click's
runner, or ``edgeopt.device.__main__.main``) and nearly all fail before any model work. The fuzz cases
(seeded, deterministic) truncate and flip bits in the npz, TOML, ONNX and bundle readers' inputs. Every
output is also appended to one log, checked at the end: ``grep -c "internal error"`` over it is 0.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from bundle_support import digits_bundle, loose_target
from conftest import TinyNet

CORPUS_LOG = "hostile-corpus-outputs.log"


@dataclass
class Ctx:
    """Paths a case builds its arguments from; ``inputs`` is the case's own folder for hostile files."""

    onnx: Path
    ir: Path
    factory: str
    calib: Path
    prev: Path  # a previous edgeopt output (the default --out): must survive byte-identical
    work: Path  # --out's parent
    inputs: Path
    bundle: Path
    target: Path  # a loose, valid profile
    env: dict


@dataclass
class Case:
    id: str
    argv: Callable[[Ctx], list]
    code: int = 2
    mention: str = ""
    device: bool = False  # run edgeopt-device instead of edgeopt


CASES: list[Case] = []


def case(id: str, code: int = 2, mention: str = "", device: bool = False):
    def add(argv):
        CASES.append(Case(id, argv, code, mention, device))
        return argv
    return add


def compress(ctx: Ctx, *extra, model=None, calib=None, out=None) -> list:
    return ["compress", ctx.onnx if model is None else model, "--calib", ctx.calib if calib is None else calib,
            "--out", ctx.prev if out is None else out, *extra]


def write(ctx: Ctx, name: str, content: str | bytes) -> Path:
    path = ctx.inputs / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def npz(ctx: Ctx, name: str, **arrays) -> Path:
    path = ctx.inputs / name
    np.savez(path, **arrays)
    return path


def hook(ctx: Ctx, body: str, name: str = "hook.py") -> str:
    return f"{write(ctx, name, body)}:data"


def factory(ctx: Ctx, body: str, name: str = "factory.py") -> str:
    text = ("import sys, torch\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from conftest import TinyNet\n" + body)
    return f"{write(ctx, name, text)}:build"


GOOD = np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32)


# 1. --out never destroys what edgeopt did not write -------------------------------------------------------------

@case("out-unrelated-folder", mention="did not write")
def _(ctx):
    (ctx.work / "d" / "sub").mkdir(parents=True)
    (ctx.work / "d" / "important.txt").write_text("x")
    return compress(ctx, out=ctx.work / "d")


@case("out-regular-file", mention="not a folder edgeopt wrote")
def _(ctx):
    (ctx.work / "f").write_text("precious")
    return compress(ctx, out=ctx.work / "f")


@case("out-symlink-to-folder", mention="not a folder edgeopt wrote")
def _(ctx):
    (ctx.work / "real").mkdir()
    (ctx.work / "link").symlink_to(ctx.work / "real")
    return compress(ctx, out=ctx.work / "link")


@case("out-dot", mention="current folder")
def _(ctx):
    os.chdir(ctx.work)
    return compress(ctx, out=".")


@case("out-dotdot", mention="current folder")
def _(ctx):
    (ctx.work / "deeper").mkdir()
    os.chdir(ctx.work / "deeper")
    return compress(ctx, out="..")


@case("out-root", mention="root")
def _(ctx):
    return compress(ctx, out="/")


@case("out-empty-name", mention="empty path")
def _(ctx):
    return compress(ctx, out="")


@case("out-parent-is-a-file", mention="not a folder")
def _(ctx):
    (ctx.work / "plain").write_text("x")
    return compress(ctx, out=ctx.work / "plain" / "out")


@case("out-folder-with-foreign-report", mention="did not write")
def _(ctx):
    (ctx.work / "r").mkdir()
    (ctx.work / "r" / "report.json").write_text('{"mine": true}')
    return compress(ctx, out=ctx.work / "r")


@case("out-folder-with-invalid-report", mention="did not write")
def _(ctx):
    (ctx.work / "r").mkdir()
    (ctx.work / "r" / "report.json").write_text("not json")
    return compress(ctx, out=ctx.work / "r")


@case("json-is-a-folder", mention="is a folder")
def _(ctx):
    (ctx.work / "j").mkdir()
    return compress(ctx, "--json", ctx.work / "j")


@case("json-is-a-user-text-file", mention="not a file edgeopt wrote")
def _(ctx):
    (ctx.work / "notes.txt").write_text("my notes")
    return compress(ctx, "--json", ctx.work / "notes.txt")


@case("package-onto-a-user-file", mention="not a file edgeopt wrote")
def _(ctx):
    (ctx.work / "firmware.bin").write_bytes(b"\x7fELF")
    return compress(ctx, "--target", ctx.target, "--package", ctx.work / "firmware.bin")


@case("optimize-out-unrelated-folder", mention="did not write")
def _(ctx):
    (ctx.work / "mine").mkdir()
    (ctx.work / "mine" / "thesis.tex").write_text("x")
    return ["optimize", ctx.onnx, "--target", ctx.target, "--calib", ctx.calib, "--eval", ctx.calib,
            "--out", ctx.work / "mine", "--cache", ctx.inputs / "cache"]


@case("optimize-out-dot", mention="current folder")
def _(ctx):
    os.chdir(ctx.work)
    return ["optimize", ctx.onnx, "--target", ctx.target, "--calib", ctx.calib, "--eval", ctx.calib,
            "--out", ".", "--cache", ctx.inputs / "cache"]


@case("package-out-user-file", mention="not a file edgeopt wrote")
def _(ctx):
    (ctx.work / "keep.tar.gz").write_bytes(gzip.compress(b"user archive"))
    return ["package", ctx.prev, "--target", ctx.target, "--out", ctx.work / "keep.tar.gz"]


@case("package-out-is-a-folder", mention="is a directory")
def _(ctx):
    (ctx.work / "dir.tar.gz").mkdir()
    return ["package", ctx.prev, "--target", ctx.target, "--out", ctx.work / "dir.tar.gz"]


@case("validate-json-is-a-folder", mention="is a folder")
def _(ctx):
    (ctx.work / "j").mkdir()
    return ["validate", ctx.onnx, "--target", ctx.target, "--json", ctx.work / "j"]


@case("validate-junit-user-file", mention="not a file edgeopt wrote")
def _(ctx):
    (ctx.work / "results.xml").write_text("my own results")
    return ["validate", ctx.onnx, "--target", ctx.target, "--junit", ctx.work / "results.xml"]


@case("verify-json-is-a-folder", mention="is a folder")
def _(ctx):
    (ctx.work / "j").mkdir()
    return ["verify", ctx.bundle, "--json", ctx.work / "j"]


@case("device-verify-json-user-file", mention="not a file edgeopt wrote", device=True)
def _(ctx):
    (ctx.work / "todo.txt").write_text("x")
    return ["verify", ctx.bundle, "--json", ctx.work / "todo.txt"]


@case("device-validate-junit-is-a-folder", mention="is a folder", device=True)
def _(ctx):
    (ctx.work / "j").mkdir()
    return ["validate", ctx.bundle, "--junit", ctx.work / "j"]


# 4. user hooks that exit or interrupt ---------------------------------------------------------------------------

for _code in ("0", "1", "None", "'bye'"):
    case(f"factory-sys-exit-{_code}", mention="sys.exit")(
        lambda ctx, c=_code: compress(ctx, model=factory(ctx, f"def build():\n    sys.exit({c})\n")))
    case(f"data-hook-sys-exit-{_code}", mention="sys.exit")(
        lambda ctx, c=_code: compress(ctx, calib=hook(ctx, f"import sys\ndef data():\n    sys.exit({c})\n")))
case("factory-raises-systemexit", mention="SystemExit")(
    lambda ctx: compress(ctx, model=factory(ctx, "def build():\n    raise SystemExit(0)\n")))
case("factory-raises-keyboardinterrupt", mention="KeyboardInterrupt")(
    lambda ctx: compress(ctx, model=factory(ctx, "def build():\n    raise KeyboardInterrupt\n")))
case("data-hook-raises-keyboardinterrupt", mention="KeyboardInterrupt")(
    lambda ctx: compress(ctx, calib=hook(ctx, "def data():\n    raise KeyboardInterrupt\n")))
case("data-hook-generator-exits", mention="sys.exit")(
    lambda ctx: compress(ctx, calib=hook(ctx, "import sys, numpy as np\ndef data():\n"
                                              "    yield np.zeros((1, 1, 8, 8), np.float32)\n    sys.exit(0)\n")))
case("factory-module-exits-on-import", mention="sys.exit")(
    lambda ctx: compress(ctx, model=factory(ctx, "sys.exit(0)\ndef build():\n    pass\n")))
case("data-hook-module-exits-on-import", mention="sys.exit")(
    lambda ctx: compress(ctx, calib=hook(ctx, "import sys\nsys.exit(0)\ndef data():\n    pass\n")))
case("factory-raises-valueerror", mention="failed")(
    lambda ctx: compress(ctx, model=factory(ctx, "def build():\n    raise ValueError('no weights')\n")))
case("factory-not-a-function", mention="has no function")(
    lambda ctx: compress(ctx, model=factory(ctx, "build = 3\n")))
case("factory-syntax-error", mention="cannot import")(
    lambda ctx: compress(ctx, model=factory(ctx, "def build(:\n")))


# 5 and 11. data: non-finite, complex, strings, float labels ----------------------------------------------------

def _with(value, index=(2, 0, 3, 3)):
    data = GOOD.copy()
    data[index] = value
    return data


for _name, _value in (("nan", np.nan), ("inf", np.inf), ("neg-inf", -np.inf)):
    case(f"calib-{_name}", mention="sample 2 input 'input'")(
        lambda ctx, v=_value: compress(ctx, calib=npz(ctx, "c.npz", input=_with(v))))
    case(f"eval-{_name}", mention="sample 2 input 'input'")(
        lambda ctx, v=_value: compress(ctx, "--eval", npz(ctx, "e.npz", input=_with(v), labels=np.arange(4))))
    case(f"npy-{_name}", mention="holds")(lambda ctx, v=_value: compress(ctx, calib=_npy(ctx, _with(v))))
    case(f"hook-{_name}", mention="holds")(
        lambda ctx, v=_value: compress(ctx, calib=hook(ctx, f"import numpy as np\ndef data():\n"
                                                             f"    return [np.full((1, 1, 8, 8), {v!r}, np.float32)]\n"
                                                             .replace("nan", "np.nan").replace("inf", "np.inf"))))


def _npy(ctx: Ctx, array) -> Path:
    path = ctx.inputs / "c.npy"
    np.save(path, array)
    return path


for _dtype in ("complex64", "complex128"):
    case(f"calib-{_dtype}", mention="complex")(
        lambda ctx, d=_dtype: compress(ctx, calib=npz(ctx, "c.npz", input=GOOD.astype(d))))
case("calib-strings", mention="non-numeric")(
    lambda ctx: compress(ctx, calib=npz(ctx, "c.npz", input=np.full((4, 1, 8, 8), "a"))))
case("calib-bytes", mention="non-numeric")(
    lambda ctx: compress(ctx, calib=npz(ctx, "c.npz", input=np.full((4, 1, 8, 8), b"a"))))
case("calib-datetime", mention="non-numeric")(
    lambda ctx: compress(ctx, calib=npz(ctx, "c.npz", input=np.zeros((4, 1, 8, 8), "datetime64[s]"))))
case("eval-float-labels-fractional", mention="not a whole class index")(
    lambda ctx: compress(ctx, "--eval", npz(ctx, "e.npz", input=GOOD, labels=np.array([0.5, 1, 2, 3]))))
case("eval-nan-labels", mention="not a whole class index")(
    lambda ctx: compress(ctx, "--eval", npz(ctx, "e.npz", input=GOOD, labels=np.array([np.nan, 1, 2, 3]))))
case("eval-string-labels", mention="class indices must be integers")(
    lambda ctx: compress(ctx, "--eval", npz(ctx, "e.npz", input=GOOD, labels=np.array(["a", "b", "c", "d"]))))
case("eval-complex-labels", mention="class indices must be integers")(
    lambda ctx: compress(ctx, "--eval", npz(ctx, "e.npz", input=GOOD, labels=np.arange(4) + 1j)))
case("eval-too-few-labels", mention="labels for")(
    lambda ctx: compress(ctx, "--eval", npz(ctx, "e.npz", input=GOOD, labels=np.arange(3))))
case("hook-float-label", mention="not a whole class index")(
    lambda ctx: compress(ctx, "--eval", hook(ctx, "import numpy as np\ndef data():\n"
                                                  "    return [(np.zeros((1, 1, 8, 8), np.float32), 2.7)]\n")))
case("hook-strings", mention="input 'input'")(
    lambda ctx: compress(ctx, calib=hook(ctx, "def data():\n    return ['a', 'b']\n")))
case("hook-returns-none", mention="failed")(
    lambda ctx: compress(ctx, calib=hook(ctx, "def data():\n    return None\n")))
case("hook-empty", mention="empty")(lambda ctx: compress(ctx, calib=hook(ctx, "def data():\n    return []\n")))
case("calib-empty", mention="empty")(
    lambda ctx: compress(ctx, calib=npz(ctx, "c.npz", input=np.zeros((0, 1, 8, 8), np.float32))))
case("calib-wrong-shape", mention="expected samples stacked")(
    lambda ctx: compress(ctx, calib=npz(ctx, "c.npz", input=np.zeros((4, 3, 8, 8), np.float32)[:, :, None])))
case("calib-rank0", mention="input 'input'")(
    lambda ctx: compress(ctx, calib=npz(ctx, "c.npz", input=np.float32(1.0))))
case("calib-two-unnamed-arrays", mention="no array named")(
    lambda ctx: compress(ctx, calib=npz(ctx, "c.npz", a=GOOD, b=GOOD)))
case("calib-object-array", mention="not a readable .npz")(
    lambda ctx: compress(ctx, calib=_pickled(ctx)))
case("calib-not-a-zip", mention="not an .npz archive")(lambda ctx: compress(ctx, calib=write(ctx, "c.npz", "hello")))
case("calib-empty-file", mention="not an .npz archive")(lambda ctx: compress(ctx, calib=write(ctx, "c.npz", b"")))
case("calib-npy-garbage", mention="not a readable .npy")(
    lambda ctx: compress(ctx, calib=write(ctx, "c.npy", b"\x93NUMPY")))
case("calib-unknown-format", mention="unknown data format")(lambda ctx: compress(ctx, calib=write(ctx, "c.csv", "1,2")))
case("calib-missing", mention="no such data")(lambda ctx: compress(ctx, calib=ctx.inputs / "nope.npz"))
case("calib-folder-corrupt-image", mention="not a readable image")(
    lambda ctx: compress(ctx, calib=write(ctx, "imgs/a/x.png", b"\x89PNG garbage").parent.parent))
case("calib-folder-bad-preprocess", mention="not valid TOML")(
    lambda ctx: (write(ctx, "imgs/preprocess.toml", "size = ["),
                 compress(ctx, calib=write(ctx, "imgs/a/x.png", b"\x89PNG").parent.parent))[1])
case("calib-folder-unknown-preprocess-key", mention="unknown key")(
    lambda ctx: (write(ctx, "imgs/preprocess.toml", "colour = 'rgb'\n"),
                 compress(ctx, calib=write(ctx, "imgs/a/x.png", b"\x89PNG").parent.parent))[1])


def _pickled(ctx: Ctx) -> Path:
    path = ctx.inputs / "c.npz"
    np.savez(path, input=np.array([{"a": 1}], dtype=object))
    return path


# 8. bad input that used to be an internal error ----------------------------------------------------------------

def recipe(ctx: Ctx, text: str | bytes) -> list:
    return compress(ctx, "--recipe", write(ctx, "recipe.toml", text))


case("recipe-subset-size-string", mention="must be an integer")(
    lambda ctx: recipe(ctx, '[[step]]\nname = "int8"\nsubset_size = "lots"\n'))
case("recipe-subset-size-float", mention="must be an integer")(
    lambda ctx: recipe(ctx, '[[step]]\nname = "int8"\nsubset_size = 1.5\n'))
case("recipe-subset-size-nan", mention="must be an integer")(
    lambda ctx: recipe(ctx, '[[step]]\nname = "int8"\nsubset_size = nan\n'))
case("recipe-preset-number", mention="must be a string")(
    lambda ctx: recipe(ctx, '[[step]]\nname = "int8"\npreset = 3\n'))
case("recipe-bias-correction-string", mention="must be true or false")(
    lambda ctx: recipe(ctx, '[[step]]\nname = "int8"\nfast_bias_correction = "yes"\n'))
case("recipe-ignored-scope-string", mention="must be an array")(
    lambda ctx: recipe(ctx, '[[step]]\nname = "int8"\nignored_scope = "conv1"\n'))
case("recipe-single-step-table", mention="[[step]]")(lambda ctx: recipe(ctx, '[step]\nname = "int8"\n'))
case("recipe-step-is-a-string", mention="[[step]]")(lambda ctx: recipe(ctx, 'step = "int8"\n'))
case("recipe-step-without-name", mention="has no name")(lambda ctx: recipe(ctx, '[[step]]\npreset = "mixed"\n'))
case("recipe-unknown-top-level-key", mention="unknown key")(lambda ctx: recipe(ctx, 'steps = []\n'))
case("recipe-invalid-toml", mention="not valid TOML")(lambda ctx: recipe(ctx, '[[step]\nname = "int8"\n'))
case("recipe-not-utf8", mention="not valid TOML")(lambda ctx: recipe(ctx, b'\xff\xfe[[step]]\nname = "int8"\n'))
case("recipe-unknown-step", mention="unknown recipe step")(lambda ctx: recipe(ctx, '[[step]]\nname = "turbo"\n'))
case("recipe-unknown-parameter", mention="unknown parameter")(
    lambda ctx: recipe(ctx, '[[step]]\nname = "int8"\nspeed = 11\n'))
case("recipe-missing-file", mention="no such recipe")(lambda ctx: compress(ctx, "--recipe", ctx.inputs / "r.toml"))
case("recipe-int8-int8", mention="more than one precision step")(lambda ctx: compress(ctx, "--recipe", "int8,int8"))
case("recipe-int8-fp16", mention="more than one precision step")(lambda ctx: compress(ctx, "--recipe", "int8,fp16"))
case("recipe-fp16-weights", mention="more than one precision step")(
    lambda ctx: compress(ctx, "--recipe", "fp16,weights"))
case("recipe-torch-step-on-onnx", mention="need(s) a PyTorch model")(
    lambda ctx: compress(ctx, "--recipe", "prune,int8"))
case("factory-returns-strings", mention="not a torch.nn.Module")(
    lambda ctx: compress(ctx, model=factory(ctx, "def build():\n    return ('a', 'b')\n")))
case("factory-returns-none", mention="must return (module, example_input)")(
    lambda ctx: compress(ctx, model=factory(ctx, "def build():\n    return None\n")))
case("factory-returns-three", mention="the third item (dynamic_axes) is a int, not a dict")(
    lambda ctx: compress(ctx, model=factory(ctx, "def build():\n    return TinyNet(), torch.zeros(1), 3\n")))
case("factory-example-not-a-tensor", mention="example input must be a tensor")(
    lambda ctx: compress(ctx, model=factory(ctx, "def build():\n    return TinyNet().eval(), 'x'\n")))
case("torchscript-wrong-channels", mention="does not run on inputs of shape")(
    lambda ctx: compress(ctx, "--input-shape", "x=1,3,16,16", model=_torchscript(ctx),
                         calib=npz(ctx, "c.npz", x=np.zeros((4, 3, 16, 16), np.float32))))
case("torchscript-without-shape", mention="--input-shape")(lambda ctx: compress(ctx, model=_torchscript(ctx)))
case("torchscript-garbage", mention="not a TorchScript")(
    lambda ctx: compress(ctx, model=write(ctx, "m.pt", b"PK\x03\x04junk")))
case("pt2-garbage", mention="not a TorchScript")(lambda ctx: compress(ctx, model=write(ctx, "m.pt2", b"junk")))
case("model-unknown-suffix", mention="unknown model format")(
    lambda ctx: compress(ctx, model=write(ctx, "m.tflite", b"x")))
case("model-is-a-folder", mention="unknown model format")(lambda ctx: compress(ctx, model=ctx.inputs))
case("model-py-without-function", mention="name the factory")(lambda ctx: compress(ctx, model=write(ctx, "m.py", "")))
case("model-missing", mention="no such model")(lambda ctx: compress(ctx, model=ctx.inputs / "none.onnx"))
case("onnx-empty-file", mention="not a valid ONNX")(lambda ctx: compress(ctx, model=write(ctx, "e.onnx", b"")))
case("onnx-text", mention="not a valid ONNX")(lambda ctx: compress(ctx, model=write(ctx, "t.onnx", "hello world")))
case("ir-without-bin", mention="weights file")(lambda ctx: compress(ctx, model=write(ctx, "m.xml", ctx.ir.read_text())))
case("ir-garbage-xml", mention="not a valid OpenVINO IR")(
    lambda ctx: (write(ctx, "g.bin", b""), compress(ctx, model=write(ctx, "g.xml", "<net><oops")))[1])
for _shape in ("input", "=1,1,8,8", "input=a,b", "input=1,,8", "input=1;1;8;8"):
    case(f"input-shape-malformed-{_shape}", mention="--input-shape")(
        lambda ctx, s=_shape: compress(ctx, "--input-shape", s))
case("input-shape-unknown-name", mention="unknown input")(lambda ctx: compress(ctx, "--input-shape", "zz=1,1,8,8"))
case("input-shape-wrong-rank", mention="--input-shape gives")(lambda ctx: compress(ctx, "--input-shape", "input=1,8,8"))
case("format-unknown", mention="unknown format")(lambda ctx: compress(ctx, "--format", "tflite"))
case("format-empty", mention="unknown format")(lambda ctx: compress(ctx, "--format", ","))
case("package-without-target", mention="--package needs --target")(
    lambda ctx: compress(ctx, "--package", ctx.work / "b.tar.gz"))
case("precision-and-recipe-precision", mention="not both")(
    lambda ctx: compress(ctx, "--precision", "fp16", "--recipe", "int8"))


def _torchscript(ctx: Ctx) -> Path:
    path = ctx.inputs / "model.pt"
    torch.manual_seed(0)
    torch.jit.trace(TinyNet().eval(), torch.zeros(1, 1, 8, 8)).save(str(path))
    return path


# 7. profiles: non-finite and other bad numbers -------------------------------------------------------------------

def profile(ctx: Ctx, budgets: str = "", extra: str = "", name: str = "bad.toml") -> Path:
    text = ctx.target.read_text()
    if budgets:
        key = budgets.split("=")[0].strip()
        text = "\n".join(line for line in text.splitlines() if not line.startswith(key + " ")) + "\n"
        text = text.replace("[budgets]\n", f"[budgets]\n{budgets}\n")
    path = ctx.inputs / name
    path.write_text(text + extra)
    return path


def validate(ctx: Ctx, target: Path, *extra) -> list:
    return ["validate", ctx.onnx, "--target", target, "--runs", "1", "--warmup", "1", "--min-seconds", "0", *extra]


for _key in ("max_file_mb", "p50_ms", "max_cv"):
    for _value in ("nan", "inf", "-inf", "+nan", "0", "-1", '"10"', "true"):
        case(f"profile-{_key}-{_value}", mention=_key)(
            lambda ctx, k=_key, v=_value: validate(ctx, profile(ctx, f"{k} = {v}")))
case("profile-unknown-key", mention="unknown key")(lambda ctx: validate(ctx, profile(ctx, extra="\n[extra]\nx = 1\n")))
case("profile-invalid-toml", mention="not valid TOML")(lambda ctx: validate(ctx, write(ctx, "p.toml", "[device\n")))
case("profile-cores-zero", mention="device.cores")(lambda ctx: validate(ctx, _cores_zero(ctx)))
case("profile-extends-missing", mention="extends")(
    lambda ctx: validate(ctx, write(ctx, "p.toml", 'extends = "no-such-base"\ndescription = "x"\n')))
case("profile-extends-itself", mention="cycle")(
    lambda ctx: validate(ctx, write(ctx, "p.toml", 'extends = "p"\ndescription = "x"\n')))
case("profile-abstract", mention="abstract")(lambda ctx: validate(ctx, "base-x86"))
case("profile-missing", mention="no such target")(lambda ctx: validate(ctx, ctx.inputs / "none.toml"))
case("profile-unknown-name", mention="unknown target")(lambda ctx: validate(ctx, "no-such-device"))
case("profile-runtime-unknown", mention="runtime.name")(
    lambda ctx: validate(ctx, write(ctx, "p.toml", ctx.target.read_text().replace('name = "openvino"',
                                                                                 'name = "tensorrt"'))))
case("targets-env-is-a-file", mention="EDGEOPT_TARGETS")(
    lambda ctx: (ctx.env.update(EDGEOPT_TARGETS=str(write(ctx, "profiles.toml", ""))),
                 ["targets", "list"])[1])
case("targets-env-is-a-file-validate", mention="EDGEOPT_TARGETS")(
    lambda ctx: (ctx.env.update(EDGEOPT_TARGETS=str(write(ctx, "p.txt", "x"))), validate(ctx, "digits-tight"))[1])


def _cores_zero(ctx: Ctx) -> Path:
    return write(ctx, "p.toml", ctx.target.read_text().replace("cores = 2", "cores = 0"))


# 9. bundles -----------------------------------------------------------------------------------------------------

def bomb(ctx: Ctx, megabytes: int = 100) -> Path:
    """A small bundle whose manifest honestly lists a huge zero-filled file."""
    from edgeopt.device.bundle_reader import canonical_json

    manifest = json.loads(_member(ctx.bundle, "manifest.json"))
    size = megabytes * 1_000_000
    digest = hashlib.sha256()
    zeros = bytes(1 << 20)
    left = size
    while left:
        digest.update(zeros[:min(left, len(zeros))])
        left -= min(left, len(zeros))
    manifest["files"]["zeros.bin"] = {"bytes": size, "sha256": digest.hexdigest()}
    path = ctx.inputs / "bomb.tar.gz"
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        text = canonical_json(manifest)
        tar.addfile(_info("manifest.json", len(text)), io.BytesIO(text))
        with tarfile.open(ctx.bundle, "r:gz") as source:
            for member in source.getmembers()[1:]:
                tar.addfile(member, source.extractfile(member))
        tar.addfile(_info("zeros.bin", size), _Zeros(size))
    return path


class _Zeros:
    def __init__(self, size):
        self.left = size

    def read(self, n=-1):
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    return info


def _member(bundle: Path, name: str) -> bytes:
    with tarfile.open(bundle, "r:gz") as tar:
        return tar.extractfile(name).read()


def appended(ctx: Ctx, extra: bytes) -> Path:
    path = ctx.inputs / "appended.tar.gz"
    path.write_bytes(ctx.bundle.read_bytes() + extra)
    return path


for _cmd, _dev in (("verify", False), ("device-verify", True), ("device-validate", True)):
    _sub = "verify" if _cmd != "device-validate" else "validate"
    case(f"{_cmd}-bomb", mention="extraction limit", device=_dev)(lambda ctx, s=_sub: [s, bomb(ctx)])
    case(f"{_cmd}-second-gzip-member", mention="after the end of the archive", device=_dev)(
        lambda ctx, s=_sub: [s, appended(ctx, gzip.compress(b"evil payload" * 100))])
    case(f"{_cmd}-trailing-garbage", mention="after the end of the archive", device=_dev)(
        lambda ctx, s=_sub: [s, appended(ctx, b"\0garbage")])
    case(f"{_cmd}-trailing-zeros", mention="after the end of the archive", device=_dev)(
        lambda ctx, s=_sub: [s, appended(ctx, bytes(1024))])
case("verify-bomb-limit-given", mention="extraction limit")(
    lambda ctx: ["verify", ctx.bundle, "--max-extract-mb", "0.001"])
case("verify-not-gzip", mention="corrupt")(lambda ctx: ["verify", write(ctx, "b.tar.gz", "hello")])
case("verify-empty-file", mention="corrupt")(lambda ctx: ["verify", write(ctx, "b.tar.gz", b"")])
case("verify-missing", mention="no such bundle")(lambda ctx: ["verify", ctx.inputs / "none.tar.gz"])
case("device-verify-missing", mention="no such bundle", device=True)(
    lambda ctx: ["verify", ctx.inputs / "none.tar.gz"])


# fuzz: seeded truncations and bit flips of every reader's input ---------------------------------------------------

def _mutations(data: bytes, seed: int, count: int, start: int = 0) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        cut = rng.randrange(0, len(data))
        out.append((f"trunc{i}-{cut}", data[:cut]))
    for i in range(count):
        pos = rng.randrange(start, len(data))
        bit = rng.randrange(8)
        flipped = bytearray(data)
        flipped[pos] ^= 1 << bit
        out.append((f"flip{i}-{pos}.{bit}", bytes(flipped)))
    return out


FUZZ_COUNT = 8  # per reader and kind: 2 x 8 x 5 readers = 80 cases


def fuzz_case(reader: str, index: int):
    def argv(ctx: Ctx):
        name, data = FUZZ[reader](ctx)[index]
        return BUILD[reader](ctx, data)
    return argv


def _fuzz_source(reader: str, ctx: Ctx) -> bytes:
    if reader == "npz":
        buffer = io.BytesIO()
        np.savez(buffer, input=GOOD, labels=np.arange(4))
        return buffer.getvalue()
    if reader == "profile":
        return ctx.target.read_bytes()
    if reader == "recipe":
        return b'[[step]]\nname = "int8"\npreset = "mixed"\nsubset_size = 64\nignored_scope = ["a", "b"]\n'
    if reader == "onnx":
        return ctx.onnx.read_bytes()
    return ctx.bundle.read_bytes()


# Seeds fixed per reader; gzip header bytes 4-9 (mtime, flags, OS) are not checked by any gzip reader, so
# bundle bit flips start at byte 10.
FUZZ = {reader: (lambda ctx, r=reader: _mutations(_fuzz_source(r, ctx), seed=sum(map(ord, r)), count=FUZZ_COUNT,
                                                    start=10 if r == "bundle" else 0))
        for reader in ("npz", "profile", "recipe", "onnx", "bundle")}
_WRONG_EVAL = {"input": np.zeros((2, 5), np.float32)}  # a set that never fits: a run that gets past the fuzzed
# file still stops (exit 2) before any model work


def _bad_eval(ctx: Ctx) -> Path:
    return npz(ctx, "wrong-eval.npz", **_WRONG_EVAL)


BUILD = {
    "npz": lambda ctx, data: compress(ctx, "--eval", _bad_eval(ctx), calib=write(ctx, "fuzz.npz", data)),
    "profile": lambda ctx, data: ["validate", ctx.inputs / "none.onnx", "--target", write(ctx, "fuzz.toml", data)],
    "recipe": lambda ctx, data: compress(ctx, "--eval", _bad_eval(ctx), "--recipe", write(ctx, "fuzz.toml", data)),
    "onnx": lambda ctx, data: compress(ctx, "--eval", _bad_eval(ctx), model=write(ctx, "fuzz.onnx", data)),
    "bundle": lambda ctx, data: ["verify", write(ctx, "fuzz.tar.gz", data)],
}
for _reader in FUZZ:
    for _i in range(2 * FUZZ_COUNT):
        case(f"fuzz-{_reader}-{'trunc' if _i < FUZZ_COUNT else 'flip'}{_i % FUZZ_COUNT}")(fuzz_case(_reader, _i))


# the runner -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def corpus_env(tmp_path_factory, tiny_onnx, tiny_ir, tiny_factory, tiny_calib):
    """The shared previous output (one real compress of the tiny model), the bundle and a loose profile."""
    from edgeopt.cli import main

    root = tmp_path_factory.mktemp("corpus")
    previous = root / "previous"
    result = CliRunner().invoke(main, ["compress", str(tiny_onnx), "--calib", str(tiny_calib), "--eval",
                                       str(tiny_calib), "--out", str(previous), "--quiet", "--max-drop", "100"])
    assert result.exit_code == 0, result.output
    target = loose_target(tmp_path_factory)
    log = root / CORPUS_LOG
    log.write_text("")
    return {"previous": previous, "bundle": digits_bundle(tmp_path_factory), "target": target, "log": log,
            "onnx": tiny_onnx, "ir": tiny_ir, "factory": tiny_factory, "calib": tiny_calib}


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (not following links): files by sha256, folders and links by kind."""
    state = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            state[rel] = "link -> " + os.readlink(path)
        elif path.is_dir():
            state[rel] = "dir"
        else:
            state[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


@pytest.mark.parametrize("hostile", CASES, ids=[c.id for c in CASES])
def test_hostile_input(hostile: Case, corpus_env, tmp_path, monkeypatch):
    work, inputs, tmp = tmp_path / "work", tmp_path / "inputs", tmp_path / "tmp"
    for folder in (work, inputs, tmp):
        folder.mkdir()
    shutil.copytree(corpus_env["previous"], work / "prev")
    ctx = Ctx(corpus_env["onnx"], corpus_env["ir"], corpus_env["factory"], corpus_env["calib"], work / "prev", work,
              inputs, corpus_env["bundle"], corpus_env["target"], {})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.delenv("EDGEOPT_TARGETS", raising=False)
    argv = [str(a) for a in hostile.argv(ctx)]
    for key, value in ctx.env.items():
        monkeypatch.setenv(key, value)
    before = snapshot(work)

    code, stderr, stdout = run(argv, hostile.device)

    with open(corpus_env["log"], "a", encoding="utf-8") as log:
        log.write(f"=== {hostile.id}: exit {code}\n{stdout}{stderr}\n")
    prog = "edgeopt-device: " if hostile.device else "edgeopt: "
    message = stderr.strip()
    assert code == hostile.code, f"{hostile.id}: exit {code}: {stderr}{stdout}"
    assert message.startswith(prog) and "\n" not in message, f"not one line: {stderr!r}"
    assert "Traceback" not in stderr + stdout and "internal error" not in stderr + stdout
    assert hostile.mention.lower() in message.lower(), message
    assert snapshot(work) == before, "files beside --out (or a previous output) changed"
    left = [p for p in tmp.iterdir() if not p.name.startswith(("torchinductor_", ".ses"))]  # torch's compile
    # cache and OpenVINO telemetry's session id: other tools' persistent files, not edgeopt's
    assert not left, f"temporary files left behind: {left}"


def run(argv: list[str], device: bool) -> tuple[int, str, str]:
    if device:
        from edgeopt.device.__main__ import main as device_main

        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = device_main(argv)
        return code, err.getvalue(), out.getvalue()
    from edgeopt.cli import main

    result = CliRunner().invoke(main, argv, catch_exceptions=False)
    return result.exit_code, result.stderr, result.stdout


def test_corpus_is_large_and_no_output_says_internal_error(corpus_env):
    """Runs after the corpus (file order): ≥ 150 cases, and ``grep -c "internal error"`` over their outputs is 0."""
    assert len(CASES) >= 150 and len({c.id for c in CASES}) == len(CASES)
    text = corpus_env["log"].read_text(encoding="utf-8")
    ran = text.count("=== ")
    if ran < len(CASES):
        pytest.skip(f"only {ran} of {len(CASES)} corpus cases ran in this session (a filtered run)")
    assert sum("internal error" in line for line in text.splitlines()) == 0
