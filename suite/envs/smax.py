"""SMAX tasks: JaxMARL's JAX re-implementation of SMAC, on four SMAC maps with SMAC's episode limits.

**SMAX is not StarCraft II.** Unit stats, dynamics, the heuristic enemy and the reward scale
differ from SMAC, so the task ids carry the prefix ``smax-`` and their numbers must never be
compared with SC2/SMAC numbers (nor with CFCQL's or OG-MARL's datasets). The real-SC2 adapter is
``suite/envs/smac.py`` (``smac-<map>``).

Setup (jaxmarl 0.2.0; see docs/smax.md):

* ``jaxmarl.make("HeuristicEnemySMAX", scenario=map_name_to_scenario(map))`` with the defaults
  (unit-list observations, discrete actions, 8 world steps per env step, heuristic enemy that
  shoots the closest unit, won_battle_bonus 1.0).
* Episode limits are SMAC's: 2s3z 120, 3s_vs_5z 250, 5m_vs_6m 70, 6h_vs_8z 150 env steps. We count
  steps ourselves: step ``limit`` sets ``timeout`` (SMAX's own counter would let an episode run
  limit+1 steps).
* ``terminal`` = the battle is over (all allies dead or all enemies dead). ``timeout`` = the limit
  was reached while both sides still stand; the two are never set together.
* ``info["won"]`` is read from the unit state: every enemy dead and at least one ally alive (a
  simultaneous wipe-out is a terminal draw, not a win). It is not inferred from reward >= 1.
* Inputs, scaled as SMAC scales its own (``INPUTS_VERSION``): the agents' observations are
  SMAX's ``unit_list`` observations, which already are (relative positions over the observer's
  sight range, health and cooldown fractions, one-hot unit types; own position over the map
  size); the global state is rebuilt from the unit state by ``SmaxCore.smac_state`` (SMAX's
  ``world_state`` has raw positions 0..32, raw cooldowns and integer unit types). Every input
  lies in [-1, 1].
* Reward: SMAX's shared team reward (normalised enemy health lost this step + 1.0 on a win),
  as reported; returns are at most about 2.
* Actions: 0-3 move (N, E, S, W), 4 stop (always available, the only action of a dead unit),
  5.. attack enemy j. ``avail`` is SMAX's mask (attack only in range and alive).
* No auto-reset: once an env is done it is frozen. Further steps return its final obs, state
  and avail again, reward 0, and the same terminal/timeout/won flags; the actions are ignored.
* Randomness: env b is reset from ``jax.random.PRNGKey(seeds[b])``; the same key stream then
  drives the enemy heuristic and the world steps, so an episode is a deterministic function of
  its seed and the ally actions.

The functional core (``SmaxCore``) is pure JAX so collection (``datasets/smax_collect.py``) and
behaviour training (``datasets/smax_behaviour.py``) can ``vmap`` + ``lax.scan`` it; ``SmaxEnv``
wraps it as a numpy ``BatchedEnv`` for evaluation.
"""

from __future__ import annotations

from functools import cache, partial
from importlib.metadata import PackageNotFoundError, version
from typing import NamedTuple

import numpy as np

from plcql_bench.suite.core.spec import Step, Task, TaskSpec

# SMAC's episode limits (smac/env/starcraft2/maps/smac_maps.py).
EPISODE_LIMITS = {"2s3z": 120, "3s_vs_5z": 250, "5m_vs_6m": 70, "6h_vs_8z": 150}
MAPS = tuple(EPISODE_LIMITS)
TIERS = ("medium", "medium-replay", "expert", "mixed")
STOP_ACTION = 4
PREFIX = "smax-"
# Version of the obs/state the wrapper emits (enters env_versions and the behaviour-policy id, so
# datasets built with other inputs show as stale). 1: SMAC-scaled state (smac_state).
INPUTS_VERSION = "smac-scaled-1"

_DESCRIPTIONS = {
    "2s3z": "2 stalkers + 3 zealots vs the same",
    "3s_vs_5z": "3 stalkers vs 5 zealots",
    "5m_vs_6m": "5 marines vs 6 marines",
    "6h_vs_8z": "6 hydralisks vs 8 zealots",
}


def map_of(task_id: str) -> str:
    if not task_id.startswith(PREFIX) or task_id[len(PREFIX):] not in EPISODE_LIMITS:
        raise KeyError(f"not a SMAX task: {task_id!r}")
    return task_id[len(PREFIX):]


class Obs(NamedTuple):
    """What the agents see after a reset/step (single env; vmapped: leading axis B)."""

    obs: object  # float32 [n, obs_dim]
    state: object  # float32 [state_dim]  (SMAX world_state)
    avail: object  # uint8 [n, n_actions]


class Carry(NamedTuple):
    """Everything that evolves with a single env."""

    env_state: object  # jaxmarl EnemySMAX state
    key: object  # PRNG key for the env's own randomness
    t: object  # int32, env steps taken
    done: object  # bool
    terminal: object  # bool
    timeout: object  # bool
    won: object  # bool
    last: Obs  # the current observation (returned again while frozen)


class Out(NamedTuple):
    """Result of one env step (single env)."""

    next: Obs
    reward: object  # float32
    terminal: object  # bool
    timeout: object  # bool
    won: object  # bool
    valid: object  # bool: this step was a real transition (the env was not already done)


class SmaxCore:
    """Pure-JAX single-env functions for one map; vmap/scan/jit them freely."""

    def __init__(self, map_name: str, episode_limit: int | None = None):
        import jaxmarl
        from jaxmarl.environments.smax import map_name_to_scenario

        self.map_name = map_name
        self.limit = int(EPISODE_LIMITS[map_name] if episode_limit is None else episode_limit)
        # SMAX's own time limit is set one above ours so it never fires first.
        self.env = jaxmarl.make("HeuristicEnemySMAX", scenario=map_name_to_scenario(map_name),
                                max_steps=self.limit + 1)
        self.n_agents = self.env.num_allies
        self.n_enemies = self.env.num_enemies
        self.agents = list(self.env.agents)
        self.n_actions = int(self.env.action_spaces[self.agents[0]].n)
        self.obs_dim = int(self.env.observation_spaces[self.agents[0]].shape[0])
        import jax

        o = jax.eval_shape(lambda k: self.smac_state(self.env.reset(k)[1].state), jax.random.PRNGKey(0))
        self.state_dim = int(o.shape[0])

    # -- helpers
    def smac_state(self, s):
        """The global state, scaled as SMAC scales its own (``get_state_dict``): per unit (allies
        then enemies) health / max health, (x - W/2) / W, (y - H/2) / H (SMAC: relative to the map
        centre over the playable width), weapon cooldown / the unit type's cooldown clipped to
        [0, 1] (as SMAX's own observation scales it), and a one-hot unit type over SMAX's 6
        types; a dead unit's row is all zeros. SMAX's ``world_state`` has raw positions (0..32),
        raw cooldowns and the integer unit types and teams appended; see docs/smax.md."""
        import jax.numpy as jnp

        e = self.env._env  # the SMAX env inside HeuristicEnemySMAX (unit tables, map size)
        types = s.unit_types
        size = jnp.array([e.map_width, e.map_height], jnp.float32)
        health = s.unit_health / e.unit_type_health[types]
        pos = (s.unit_positions - size / 2) / size
        cooldown = jnp.clip(s.unit_weapon_cooldowns / e.unit_type_weapon_cooldowns[types], 0.0, 1.0)
        onehot = jnp.eye(e.unit_type_bits, dtype=jnp.float32)[types]
        rows = jnp.concatenate([health[:, None], pos, cooldown[:, None], onehot], axis=-1)
        rows = jnp.where(s.unit_alive[:, None], rows, 0.0)
        return rows.reshape(-1).astype(jnp.float32)

    def _observe(self, obs_dict, env_state) -> Obs:
        import jax.numpy as jnp

        obs = jnp.stack([obs_dict[a] for a in self.agents]).astype(jnp.float32)
        avail_d = self.env.get_avail_actions(env_state)
        avail = jnp.stack([avail_d[a] for a in self.agents]).astype(jnp.uint8)
        return Obs(obs, self.smac_state(env_state.state), avail)

    # -- API
    def reset(self, key) -> Carry:
        import jax
        import jax.numpy as jnp

        key, reset_key = jax.random.split(key)
        obs_dict, env_state = self.env.reset(reset_key)
        f = jnp.array(False)
        return Carry(env_state, key, jnp.int32(0), f, f, f, f, self._observe(obs_dict, env_state))

    def step(self, carry: Carry, actions) -> tuple[Carry, Out]:
        """actions int [n]. A done env is frozen (see the module docstring)."""
        import jax
        import jax.numpy as jnp

        key, step_key = jax.random.split(carry.key)
        act = {a: actions[i] for i, a in enumerate(self.agents)}
        obs_dict, env_state, rewards, _, _ = self.env.step_env(step_key, carry.env_state, act)
        alive = env_state.state.unit_alive
        allies = alive[: self.n_agents].any()
        enemies = alive[self.n_agents:].any()
        over = ~allies | ~enemies
        won = ~enemies & allies
        t = carry.t + 1
        timeout = (t >= self.limit) & ~over
        nxt = self._observe(obs_dict, env_state)
        reward = rewards[self.agents[0]].astype(jnp.float32)

        d = carry.done
        keep = lambda old, new: jax.tree.map(lambda o, n: jnp.where(d, o, n), old, new)  # noqa: E731
        new = Carry(
            env_state=keep(carry.env_state, env_state),
            key=key,
            t=jnp.where(d, carry.t, t),
            done=d | over | timeout,
            terminal=jnp.where(d, carry.terminal, over),
            timeout=jnp.where(d, carry.timeout, timeout),
            won=jnp.where(d, carry.won, won),
            last=keep(carry.last, nxt),
        )
        out = Out(new.last, jnp.where(d, 0.0, reward).astype(jnp.float32), new.terminal,
                  new.timeout, new.won, ~d)
        return new, out

    def step_autoreset(self, carry: Carry, actions) -> tuple[Carry, Out]:
        """Like step, but a finished env restarts at once (for online training). `Out.next` is
        the true next observation of the transition; the returned carry holds the new episode."""
        import jax
        import jax.numpy as jnp

        new, out = self.step(carry, actions)
        key, reset_key = jax.random.split(new.key)
        fresh = self.reset(reset_key)
        new = new._replace(key=key)
        new = jax.tree.map(lambda r, n: jnp.where(new.done, r, n), fresh, new)
        return new, out


# --------------------------------------------------------------------------- numpy BatchedEnv


@cache
def _core(map_name: str, episode_limit: int | None = None) -> SmaxCore:
    return SmaxCore(map_name, episode_limit)


@cache
def _jitted(map_name: str, episode_limit: int | None = None):
    import jax

    core = _core(map_name, episode_limit)
    reset = jax.jit(jax.vmap(lambda s: core.reset(jax.random.PRNGKey(s))))
    step = jax.jit(jax.vmap(core.step))
    return reset, step


class SmaxEnv:
    """B SMAX envs in lockstep (implements suite.core.spec.BatchedEnv); jitted, vmapped step."""

    def __init__(self, spec: TaskSpec, map_name: str, num_envs: int,
                 episode_limit: int | None = None):
        """episode_limit overrides the SMAC limit (for tests and tools only)."""
        self.spec, self.map_name, self.num_envs = spec, map_name, int(num_envs)
        self._reset, self._step = _jitted(map_name, episode_limit)
        self._carry: Carry | None = None

    def _to_step(self, o: Obs, reward, terminal, timeout, won) -> Step:
        return Step(
            obs=np.asarray(o.obs, np.float32), state=np.asarray(o.state, np.float32),
            avail=np.asarray(o.avail, np.uint8), reward=np.asarray(reward, np.float32),
            terminal=np.asarray(terminal, bool), timeout=np.asarray(timeout, bool),
            info={"won": np.asarray(won, bool)},
        )

    def reset(self, seeds: np.ndarray) -> Step:
        seeds = np.asarray(seeds).reshape(-1)
        if len(seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        if (seeds < 0).any() or (seeds >= 2**32).any():
            raise ValueError("SMAX seeds must be in [0, 2**32)")
        self._carry = self._reset(seeds.astype(np.uint32))
        b = self.num_envs
        z = np.zeros(b, bool)
        return self._to_step(self._carry.last, np.zeros(b, np.float32), z, z, z)

    def step(self, actions: np.ndarray) -> Step:
        if self._carry is None:
            raise RuntimeError("step() before reset()")
        act = np.asarray(actions)
        if act.shape != (self.num_envs, self.spec.n_agents):
            raise ValueError(f"actions must be [{self.num_envs}, {self.spec.n_agents}], got {act.shape}")
        self._carry, out = self._step(self._carry, act.astype(np.int32))
        return self._to_step(out.next, out.reward, out.terminal, out.timeout, out.won)


# --------------------------------------------------------------------------- tasks


def env_versions(map_name: str) -> dict[str, str]:
    v = {}
    for pkg in ("jax", "jaxlib", "jaxmarl"):
        try:
            v[pkg] = version(pkg)
        except PackageNotFoundError:
            v[pkg] = "not-installed"
    v.update({"smax_map": map_name, "smax_enemy": "heuristic(closest,shoot)",
              "episode_limit": str(EPISODE_LIMITS[map_name]), "simulator": "jaxmarl-smax (not SC2)",
              "inputs": INPUTS_VERSION})
    return v


# Shapes per map (checked against jaxmarl in tests), so specs do not need jax to be built.
SHAPES = {  # map: (n_agents, obs_dim, state_dim, n_actions)
    "2s3z": (5, 127, 100, 10),
    "3s_vs_5z": (3, 101, 80, 10),
    "5m_vs_6m": (5, 140, 110, 11),
    "6h_vs_8z": (6, 179, 140, 13),
}


def make_spec(map_name: str) -> TaskSpec:
    n, obs_dim, state_dim, n_actions = SHAPES[map_name]
    return TaskSpec(
        task_id=PREFIX + map_name, domain="smax", n_agents=n, obs_dim=obs_dim,
        state_dim=state_dim, act_dim=n_actions, discrete=True,
        episode_limit=EPISODE_LIMITS[map_name], tiers=TIERS, score="win_rate",
        description=f"JaxMARL SMAX {map_name} ({_DESCRIPTIONS[map_name]}), heuristic enemy, "
                    f"SMAC episode limit {EPISODE_LIMITS[map_name]}; not StarCraft II",
        env_versions=partial(env_versions, map_name),
    )


def make_task(map_name: str) -> Task:
    spec = make_spec(map_name)
    return Task(spec=spec, make_env=partial(SmaxEnv, spec, map_name))
