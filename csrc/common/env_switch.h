// The extension's environment switches (FLASHATTN_FORCE_SM80, FLASHATTN_SM90_*), read on every call so
// that one process (a test, an A/B script) can compare their settings without a second build.
#pragma once

#include <cstdlib>

namespace flashattn {

// Switch `name`: "1..." on, "0..." off; unset or anything else, `fallback`.
inline bool env_switch(const char* name, bool fallback) {
  const char* env = std::getenv(name);
  return env != nullptr && (env[0] == '0' || env[0] == '1') ? env[0] == '1' : fallback;
}

}  // namespace flashattn
