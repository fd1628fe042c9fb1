"""Settings of the planner's switches (flashattn.plan), as the dev scripts take them: semicolon-separated
settings, each a comma-separated list of OPTION=VALUE ("-" for none changed), e.g.
"-;sm90_multicast=off;sm90_wide_key_blocks=on,sm90_multicast=off". VALUE is on/off/auto for the
three-way options, an integer for smem_per_block_cap and decode_stages, and 1/0 (or true/false) for the
others. One process can time or run each setting in
turn."""
import flashattn.plan

_BOOLS = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}


def assignments(setting):
    """{OPTION: value} of one setting."""
    out = {}
    for item in setting.split(","):
        if "=" not in item:
            continue
        name, value = item.split("=", 1)
        if name in ("sm90_multicast", "sm90_wide_key_blocks"):
            out[name] = value
        elif name in ("smem_per_block_cap", "decode_stages"):
            out[name] = int(value)
        else:
            out[name] = _BOOLS[value.lower()]
    return out


def switches_of(settings):
    """Every option that some setting assigns."""
    return {name for setting in settings for name in assignments(setting)}


_DEFAULTS = None


def apply(setting, switches):
    """Puts every option in `switches` back to the process's starting value, then applies the setting's own
    (None: leave them all at their starting values)."""
    global _DEFAULTS
    if _DEFAULTS is None:
        _DEFAULTS = flashattn.plan.current_options()
    flashattn.plan.set_options(**{name: _DEFAULTS[name] for name in switches})
    if setting is not None:
        flashattn.plan.set_options(**assignments(setting))
