"""Typed validation of what a user configures: algorithm config fields (from an algorithm's
defaults, algorithms/configs/*.yaml, a profile's ``algo_overrides`` and ``--set``) and the small
building blocks the profile schema (suite/runs/profiles) uses.

Every error is a :class:`ConfigError` (a BenchError: one line, exit status 2) of the form
``<where>: <field>: <problem>``, where ``where`` names the file or the flag. Validation never
changes a valid value (an int stays an int where a float is expected), so a valid config hashes
to the same run key as before validation existed.

    check_config(cls, values, where)       every field known to cls.Config, of its type and range
    did_you_mean(name, choices)            " (did you mean 'x'?)" or ""
    excerpt(value)                         a value as an error message may quote it (short, bounded work)
    load_user_yaml(text, source)           YAML a user wrote (a profile, a campaign), aliases refused
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import yaml

from plcql_bench.suite.core.errors import BenchError


class ConfigError(BenchError):
    """A configuration value or key that is not allowed; the message names the file/flag and field."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_key(where: str, key: str, choices: Iterable[str], what: str = "unknown key",
                path: str = "") -> ConfigError:
    """``<where>: <path><key>: <what> (did you mean ...?)``; ``path`` is the dotted prefix of the key."""
    choices = sorted(str(c) for c in choices)
    hint = did_you_mean(key, choices) or (f" (known: {', '.join(choices)})" if len(choices) <= 40 else "")
    return ConfigError(f"{where}: {path}{key}: {what}{hint}")


# ----------------------------------------------------------------------------- quoting values, reading YAML
_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel, _EXCERPT.maxstring, _EXCERPT.maxother, _EXCERPT.maxlong = 3, 40, 40, 40
_EXCERPT.maxlist = _EXCERPT.maxtuple = _EXCERPT.maxdict = _EXCERPT.maxset = 4
EXCERPT_CHARS = 80


def excerpt(value: Any) -> str:
    """``repr(value)`` cut to at most EXCERPT_CHARS characters, built without ever forming the full repr
    (a value expanded from YAML aliases can be billions of elements: its repr alone filled 3 GB)."""
    text = _EXCERPT.repr(value)
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS - 3] + "..."


def load_user_yaml(text: str, source: str) -> Any:
    """A YAML document a user wrote (a profile, a campaign), refusing aliases (``*name``): nothing such a
    file needs them for, and a few lines of nested aliases expand to billions of values. ConfigError
    naming ``source`` (and the line) on an alias or invalid YAML."""

    class _NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise ConfigError(f"{source}: line {event.start_mark.line + 1}: YAML alias *{str(event.anchor)[:40]} "
                                  f"is not allowed here (write the value out)")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=_NoAliases)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {' '.join(str(exc).split())}") from None


# ----------------------------------------------------------------------------- value kinds
def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_KIND_TEST: dict[str, Callable[[Any], bool]] = {
    "int": is_int,
    "float": is_number,  # an int is a valid float (kept as given: it is hashed as written)
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "None": lambda v: v is None,
}
_KIND_TEXT = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "None": "null"}


def field_kinds(annotation: Any) -> tuple[str, ...] | None:
    """The value kinds a dataclass field annotation allows ('int', 'float', 'bool', 'str', 'None'),
    or None when the annotation is something this check does not cover (then any value passes)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = text.replace(" ", "").replace("typing.", "").replace("NoneType", "None")
    m = re.fullmatch(r"(Optional|Union)\[(.*)\]", text)
    if m:
        parts = m.group(2).split(",") + (["None"] if m.group(1) == "Optional" else [])
    else:
        parts = text.split("|")
    if not parts or any(p not in _KIND_TEST for p in parts):
        return None
    return tuple(dict.fromkeys(parts))


def kinds_text(kinds: tuple[str, ...]) -> str:
    return " or ".join(_KIND_TEXT[k] for k in kinds)


# ----------------------------------------------------------------------------- ranges of config fields
@dataclass(frozen=True)
class Rule:
    ok: Callable[[Any], bool]
    text: str  # "must be <text>"


def _at_least(lo: float) -> Rule:
    return Rule(lambda v: not is_number(v) or v >= lo, f">= {lo:g}")


_POSITIVE = Rule(lambda v: not is_number(v) or v > 0, "> 0")
_UNIT = Rule(lambda v: not is_number(v) or 0 <= v <= 1, "in [0, 1]")
_OPEN_UNIT = Rule(lambda v: not is_number(v) or 0 < v < 1, "in (0, 1)")


def _one_of(*allowed: Any) -> Rule:
    return Rule(lambda v: v in allowed, "one of " + ", ".join(repr(a) for a in allowed))


# Field name -> its range, for every algorithm that has the field. Only ranges outside of which the
# field is meaningless; sizes and counts are integers >= 1, learning rates positive.
FIELD_RULES: dict[str, Rule] = {
    **dict.fromkeys((
        "batch_size", "batch_episodes", "hidden", "critic_hidden", "par_hidden", "n_critics", "n_hidden",
        "n_sampled_actions", "n_timesteps", "omar_iters", "omar_num_elites", "omar_num_samples", "layers",
        "heads", "embed", "hypernet_embed", "mixing_embed", "mixing_embed_dim", "context", "time_dim",
        "ppo_epochs", "value_steps", "update_ema_every", "target_update_interval", "ca_ratio",
        "behaviour_patience"), _at_least(1)),
    # behaviour_max_updates: 0 = no cap (beta trains for the reference's timestep budget).
    **dict.fromkeys(("teacher_rounds", "step_start_ema", "behaviour_max_updates"), _at_least(0)),
    **dict.fromkeys(("optim_eps", "weight_eps", "ppo_clip", "omar_sigma", "max_weight", "cf_block_mb", "temperature",
                     "lse_temp", "reward_scale", "return_scale"), _POSITIVE),
    # Learning rates above 1 only diverge (lr=1e308 overflowed at round 7, after the run was written).
    **dict.fromkeys(("lr", "critic_lr"), Rule(lambda v: not is_number(v) or 0 < v <= 1, "in (0, 1]")),
    # Auxiliary learning rates may be 0: it freezes that part (tests/test_plcql_par.py freezes pi_par).
    **dict.fromkeys(("behaviour_lr", "par_lr", "value_lr"), _UNIT),
    "gamma": Rule(lambda v: not is_number(v) or 0 < v <= 1, "in (0, 1]"),
    **dict.fromkeys(("tau", "target_rate", "ema_decay", "td_lambda", "optim_alpha"), _UNIT),
    "expectile": _OPEN_UNIT,
    **dict.fromkeys(("cql_alpha", "grad_clip", "par_grad_clip", "weight_decay", "entropy_coef", "action_l2",
                     "target_noise", "cql_sample_noise", "other_action_jitter", "lcb_beta", "softmax_temp",
                     "omar_coe"), _at_least(0)),
    "u_ddof": _one_of(0, 1),
    "fixed_k": Rule(lambda v: v is None or v in ("n", "uniform") or (is_int(v) and v >= 1),
                    "null, 'n', 'uniform' or an integer >= 1"),
    "par_reward": _one_of("paper", "lcb"),
    "advantage_norm": _one_of("advantage", "reward", "none"),
    "replace_with": _one_of("online", "target"),
    "critic_clip": _one_of("joint", "per-member"),
    "par_updates": _one_of("every-batch", "first-batch"),
    "uncertainty_from": _one_of("online", "target"),
    "weights_per": _one_of("sample", "batch"),
    "omar_search": _one_of("argmax", "sampled"),
    "omar_mode": _one_of("softmax", "cem"),
    "cql_policy_density": _one_of("pdf", "log"),
    # (CFCQL itself refuses a first flag of 0 at its first update: tests/test_exec.py relies on that)
    "sample_action_class": Rule(lambda v: isinstance(v, str) and re.fullmatch(r"[01]-[01]-[01]", v) is not None,
                                "three 0/1 flags 'uniform-current-next', e.g. '1-0-0'"),
}


FLOAT_LIMIT = 1e6  # the magnitude no float config field reaches (the largest shipped: 1000); beyond it, a typo


def field_problem(name: str, annotation: Any, value: Any) -> str | None:
    """Why ``value`` is not valid for a config field (type, finiteness, range), or None."""
    kinds = field_kinds(annotation)
    if kinds is not None and not any(_KIND_TEST[k](value) for k in kinds):
        return f"must be {kinds_text(kinds)}, got {excerpt(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be finite, got {value!r}"
    rule = FIELD_RULES.get(name)
    if rule is not None and not rule.ok(value):
        return f"must be {rule.text}, got {excerpt(value)}"
    if kinds is not None and "float" in kinds and is_number(value) and abs(value) > FLOAT_LIMIT:
        return f"must be within \u00b1{FLOAT_LIMIT:g} (no rate, scale or coefficient is larger), got {excerpt(value)}"
    return None


def config_fields(cls: type) -> dict[str, Any]:
    """{field name: annotation} of an algorithm class's Config."""
    return {f.name: f.type for f in dataclasses.fields(cls.Config)}


def check_config(cls: type, values: dict[str, Any], where: str, path: str = "") -> None:
    """Every key a field of ``cls.Config``, every value of the field's type and in its range;
    ConfigError ``<where>: <path><field>: <problem>`` naming the algorithm otherwise."""
    known = config_fields(cls)
    for key, value in values.items():
        if key not in known:
            raise unknown_key(where, key, known, what=f"unknown config field of {cls.name}", path=path)
        problem = field_problem(key, known[key], value)
        if problem:
            raise ConfigError(f"{where}: {path}{key}: {problem} ({cls.name} config)")
