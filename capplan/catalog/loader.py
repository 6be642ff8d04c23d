"""Load catalogs on explicit call (never at import) and resolve user-typed names."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from capplan.catalog.schema import GpuSpec, ModelSpec, Quantization
from capplan.errors import CatalogError, InputError, nearest, validation_error_line

T = TypeVar("T", bound=BaseModel)


def package_dir(name: str) -> Path:
    """A data folder shipped with capplan (gpu_catalog, model_catalog, examples).

    The repository keeps them at its top level (the design card's layout); the wheel carries
    them inside the package (pyproject force-include), so an installed copy finds them there
    and a source checkout (editable install) finds them beside the package.
    """
    inside = Path(str(resources.files("capplan").joinpath(name)))
    if inside.is_dir():
        return inside
    return Path(__file__).resolve().parents[2] / name


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader (C when available) that also reads `1e3`, `2.5e1`, `1e-05` as floats:
    YAML 1.1 wants a dot in a float, so PyYAML read these (what JSON writers emit) as strings
    and the strict schemas refused them."""


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping names a key twice (PyYAML keeps the last silently)."""


def _construct_mapping(self: Any, node: yaml.Node, deep: bool = False) -> Any:
    """SafeConstructor.construct_mapping refusing duplicate keys: a plan with two `model:`
    keys planned the second, and two `workloads:` gave an error about the wrong one. YAML 1.2
    (section 3.2.1.1) requires mapping keys to be unique; merge keys (`<<`) are exempt."""
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or \
                    key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise _DuplicateKey(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
    return yaml.constructor.SafeConstructor.construct_mapping(self, node, deep)


_Loader.construct_mapping = _construct_mapping  # type: ignore[method-assign]


# YAML 1.1 reads `15:00` as the base-60 integer 900 (and `1:30.5` as 90.5): a time of day in a
# plan file (`at: 15:00`) would silently become seconds. YAML 1.2 dropped base-60 numbers, so
# this loader keeps PyYAML's int and float forms without them (pyyaml resolver.py, less its
# `(?::[0-5]?[0-9])+` alternatives) and `15:00` stays the string "15:00".
_NO_BASE60 = {
    "tag:yaml.org,2002:int": re.compile(r"""^(?:[-+]?0b[0-1_]+
                                          |[-+]?0[0-7_]+
                                          |[-+]?(?:0|[1-9][0-9_]*)
                                          |[-+]?0x[0-9a-fA-F_]+)$""", re.X),
    "tag:yaml.org,2002:float": re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                                            |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                                            |[-+]?\.(?:inf|Inf|INF)
                                            |\.(?:nan|NaN|NAN))$""", re.X),
}
_Loader.yaml_implicit_resolvers = {  # the class's own copy; SafeLoader's stays as it is
    first: [(tag, _NO_BASE60.get(tag, regexp)) for tag, regexp in resolvers]
    for first, resolvers in _Loader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))
_LOADER = _Loader


def read_yaml(path: Path) -> Any:
    """yaml.safe_load with a one-line error naming the file and line."""
    from capplan.limits import check_cap, check_input_file, read_text

    # the parser needs ~130x the text in memory: a smaller cap than file_bytes
    check_cap("yaml_bytes", check_input_file(path, "YAML file"), f"{path}")
    try:
        text = read_text(path, "YAML file")
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a SafeLoader (C when available)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        kind = "" if isinstance(e, _DuplicateKey) else "YAML syntax error: "
        raise InputError(f"{where}: {kind}{problem}") from e


def validation_message(e: ValidationError, valid_keys: list[str] | None = None) -> str:
    """The pydantic error as 'key.path: message', suggesting the nearest key if unknown."""
    return validation_error_line(e, valid_keys or [])[1]


def load_spec(path: Path, cls: type[T]) -> T:
    return _validated(path, read_yaml(path), cls)


def _validated(path: Path, data: Any, cls: type[T]) -> T:
    """A file's YAML as a catalog entry, or a CatalogError naming the file."""
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: expected a mapping at the top level")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise CatalogError(f"{path}: {validation_message(e, list(cls.model_fields))}") from e


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


# Checkpoint-name suffixes that do not change the architecture; some imply the weight dtype.
_SUFFIX_DTYPE: list[tuple[str, str | None]] = [
    ("-quantized.w8a8", "int8"), ("-quantized.w4a16", "int4"), ("-quantized.w8a16", "int8"),
    ("-fp8-dynamic", "fp8"), ("-fp8", "fp8"), ("-w8a8", "int8"), ("-int8", "int8"),
    ("-w4a16", "int4"), ("-awq", "int4"), ("-gptq-int4", "int4"), ("-gptq", "int4"),
    ("-int4", "int4"), ("-nvfp4", "fp4"), ("-fp4", "fp4"), ("-mxfp4", "fp4"),
    ("-instruct", None), ("-chat", None), ("-it", None), ("-hf", None), ("-base", None),
    ("-2507", None), ("-0528", None), ("-thinking", None), ("-pt", None),
]


@dataclass(frozen=True)
class ResolvedModel:
    spec: ModelSpec
    """The architecture, with hf_id set to the checkpoint to serve (served_id)."""
    implied_weight_dtype: str | None = None
    served_id: str = ""
    """The checkpoint launch lines serve: the Hugging Face id the user typed, the imported
    config's id (or its folder), or the catalog's hf_id for a catalog key."""


# Checkpoint formats a name suffix implies (the checkpoint ships them; vLLM reads its config).
_IMPLIED_FORMAT = {"fp8": ("fp8", None), "int8": ("int8", None), "int4": ("int4", 128),
                   "fp4": ("nvfp4", 16)}


def _served(spec: ModelSpec, name: str, implied: str | None) -> ResolvedModel:
    """The spec as the named checkpoint: its id, its own quantization, its context limit."""
    served = name.strip() if "/" in name and not Path(name).exists() else spec.hf_id
    update: dict[str, Any] = {"hf_id": served}
    if implied in _IMPLIED_FORMAT and spec.quantization is None:
        fmt, group = _IMPLIED_FORMAT[implied]
        update["quantization"] = Quantization(format=fmt, group_size=group)  # type: ignore[arg-type]
    limit = {k.lower(): v for k, v in spec.max_position_embeddings_by_id.items()}.get(
        served.lower())
    if limit:
        update["max_position_embeddings"] = limit
    return ResolvedModel(spec.model_copy(update=update), implied, served)


def model_from_path(path: Path) -> ResolvedModel:
    """--model PATH: a catalog YAML, a config.json, or a folder holding config.json."""
    from capplan.catalog.hf_import import import_config

    if path.suffix in (".yaml", ".yml"):
        spec = load_spec(path, ModelSpec)
        return ResolvedModel(spec, None, spec.hf_id)
    folder = path if path.is_dir() else path.parent
    if path.is_dir() and not (path / "config.json").is_file():
        raise InputError(f"--model {path}: folder has no config.json")
    spec = import_config(path)
    hf = spec.hf_id
    if hf == spec.key or Path(hf).exists() or "/" not in hf:
        hf = str(folder) if path.is_dir() else spec.key  # vLLM serves a local folder by path
    spec = spec.model_copy(update={"hf_id": hf})
    return ResolvedModel(spec, None, hf)


@dataclass
class Catalog:
    """GPU and model catalogs, plus the calibration files found next to them."""

    gpus: dict[str, GpuSpec] = field(default_factory=dict)
    models: dict[str, ModelSpec] = field(default_factory=dict)
    calibration_dirs: list[Path] = field(default_factory=list)

    # ---- GPUs -----------------------------------------------------------------------------
    def gpu(self, name: str) -> GpuSpec:
        for spec in self.gpus.values():
            if names_entry(name, spec):
                return spec
        choices = [*self.gpus, *(n for g in self.gpus.values() for n in g.nvml_names)]
        near = ", ".join(nearest(name, choices))
        raise CatalogError(f"unknown GPU {name!r}; nearest: {near} (see `capplan gpus`)")

    # ---- models ---------------------------------------------------------------------------
    def _model_index(self) -> dict[str, ModelSpec]:
        index: dict[str, ModelSpec] = {}
        for spec in self.models.values():
            for n in (spec.key, spec.hf_id, *spec.aliases):
                index.setdefault(_norm(n), spec)
                index.setdefault(_norm(n.split("/")[-1]), spec)
        for spec in self.models.values():  # keys win over other models' aliases
            index[_norm(spec.key)] = spec
        return index

    def resolve_model(self, name: str) -> ResolvedModel:
        path = Path(name).expanduser()
        if (path.suffix in (".yaml", ".yml", ".json") or os.sep in name) and path.exists():
            return model_from_path(path)
        index = self._model_index()
        want = _norm(name)
        candidates = [want, want.split("/")[-1]]
        implied: str | None = None
        base = want.split("/")[-1]
        for _ in range(4):  # peel up to four suffixes: Llama-3.1-8B-Instruct-FP8-dynamic
            for suffix, dtype in _SUFFIX_DTYPE:
                if base.endswith(suffix):
                    base = base[: -len(suffix)]
                    implied = implied or dtype
                    candidates.append(base)
                    break
        candidates += [c.removeprefix("meta-") for c in candidates]
        for c in candidates:
            if c in index:
                return _served(index[c], name, implied)
        near = ", ".join(nearest(base, list(self.models)))
        raise CatalogError(f"unknown model {name!r}; nearest: {near} (see `capplan models`)")

    def model(self, name: str) -> ModelSpec:
        return self.resolve_model(name).spec


def _read_dir(folder: Path, cls: type[T]) -> dict[str, tuple[T, Path, bool]]:
    """Each entry of a catalog folder by key, with its file and its `overrides:` flag (a
    catalog-dir entry's consent to replace a shipped one; not part of the schema)."""
    out: dict[str, tuple[T, Path, bool]] = {}
    for path in sorted(folder.glob("*.yaml")):
        data = read_yaml(path)
        over = data.pop("overrides", False) if isinstance(data, dict) else False
        if not isinstance(over, bool):
            raise CatalogError(f"{path}: overrides must be true or false")
        spec = _validated(path, data, cls)
        key = spec.key  # type: ignore[attr-defined]
        if key in out:
            raise CatalogError(f"{path}: key {key!r} is also the key of {out[key][1]}; each "
                               "entry needs its own key")
        out[key] = (spec, path, over)
    return out


def entry_names(spec: BaseModel) -> set[str]:
    """The names a user may type for an entry (what Catalog.gpu / resolve_model match): a GPU's
    key, name, aliases and NVML names; a model's key and aliases."""
    names = [spec.key, *spec.aliases]  # type: ignore[attr-defined]
    if isinstance(spec, GpuSpec):
        names += [spec.name, *spec.nvml_names]
    return {_norm(n) for n in names}


def names_entry(name: str, spec: BaseModel) -> bool:
    """`name` is one of the names the catalog knows the entry by (entry_names)."""
    return _norm(name) in entry_names(spec)


def _overlay(target: dict[str, T], origin: dict[str, Path], entries: dict[str, tuple[T, Path,
             bool]], kind: str) -> None:
    """Add a catalog dir's entries over the catalog's. An entry sharing a key or another name
    with one already there (a custom `llama-3.1-8b`, a GPU declaring the alias `h100`) would
    replace it, or be shadowed by it, without a word: it is refused naming both files unless
    the file says `overrides: true`, and then a note says which entry it replaced."""
    import sys

    for key, (spec, path, over) in entries.items():
        mine = entry_names(spec)
        hit = [k for k, old in target.items() if mine & entry_names(old)]
        if hit and not over:
            clash = sorted(mine & entry_names(target[hit[0]]))[0]
            raise CatalogError(
                f"{path}: the name {clash!r} already names {kind} {hit[0]!r} "
                f"({origin[hit[0]]}); give the entry its own key and aliases, or add "
                "`overrides: true` to replace that one")
        for k in hit:
            print(f"note: {path} replaces {kind} {k!r} ({origin.pop(k)})", file=sys.stderr)
            del target[k]
        target[key] = spec
        origin[key] = path


def load_catalog(extra_dirs: tuple[str, ...] | list[str] = ()) -> Catalog:
    """The shipped catalogs, overlaid by each extra dir's gpus/ and models/ folders (and its
    calibrations/ first in the search)."""
    env = os.environ.get("CAPPLAN_CATALOG_DIR")
    dirs = [*(env.split(os.pathsep) if env else []), *extra_dirs]
    return _load_cached(tuple(dirs))


_SUBDIRS = ("gpus", "models", "calibrations")


@lru_cache(maxsize=8)
def _load_cached(extra_dirs: tuple[str, ...]) -> Catalog:
    shipped = {"GPU": _read_dir(package_dir("gpu_catalog"), GpuSpec),
               "model": _read_dir(package_dir("model_catalog"), ModelSpec)}
    cat = Catalog(
        gpus={k: v[0] for k, v in shipped["GPU"].items()},  # type: ignore[misc]
        models={k: v[0] for k, v in shipped["model"].items()},  # type: ignore[misc]
        calibration_dirs=[package_dir("gpu_catalog") / "calibrations"],
    )
    origin = {kind: {k: v[1] for k, v in entries.items()} for kind, entries in shipped.items()}
    for d in extra_dirs:
        root = Path(d)
        if not root.is_dir():
            raise InputError(f"--catalog-dir {d}: not a folder")
        if not any((root / sub).is_dir() for sub in _SUBDIRS):
            raise InputError(f"--catalog-dir {d}: no gpus/, models/ or calibrations/ folder in "
                             "it; give the folder that holds them")
        for sub, cls, target, kind in (("gpus", GpuSpec, cat.gpus, "GPU"),
                                       ("models", ModelSpec, cat.models, "model")):
            if (root / sub).is_dir():
                _overlay(target, origin[kind], _read_dir(root / sub, cls), kind)  # type: ignore[arg-type]
        if (root / "calibrations").is_dir():
            cat.calibration_dirs.insert(0, root / "calibrations")
    return cat
