"""Settings of the extension's environment switches, as the dev scripts take them: semicolon-separated
settings, each a comma-separated list of NAME=VALUE ("-" for none set), e.g.
"-;FLASHATTN_SM90_Q_REGISTERS=1;FLASHATTN_SM90_WIDE_KEY_BLOCKS=1,FLASHATTN_SM90_MULTICAST=0". The
switches are read on every call, so one process can time or run each setting in turn."""
import os


def assignments(setting):
    """[(NAME, VALUE)] of one setting."""
    return [tuple(a.split("=", 1)) for a in setting.split(",") if "=" in a]


def switches_of(settings):
    """Every switch that some setting assigns."""
    return {name for setting in settings for name, _ in assignments(setting)}


def apply(setting, switches):
    """Unsets every switch in `switches`, then sets the setting's own (None: leave them all unset)."""
    for name in switches:
        os.environ.pop(name, None)
    if setting is not None:
        os.environ.update(assignments(setting))
