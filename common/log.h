/*
 * log.h - leveled, component-tagged logging to stderr.
 *
 * LYNX_LOG checks the level before it evaluates its arguments. LYNX_LOG_RL
 * is for the data path and for what strangers can trigger: per call site
 * and thread, a burst of LYNX_LOG_RL_BURST lines, then one a second, each
 * with a count of what it suppressed, so a flood of bad datagrams or
 * connections cannot turn into a flood of log lines.
 */
#ifndef LYNX_LOG_H
#define LYNX_LOG_H

#include <stdint.h>

enum lynx_log_level {
  LYNX_LOG_ERROR = 0,
  LYNX_LOG_WARN = 1,
  LYNX_LOG_INFO = 2,
  LYNX_LOG_DEBUG = 3,
};

extern int lynx_log_level;

void lynx__log(int level, const char *comp, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses "error|warn|info|debug"; -EINVAL when unknown. */
int lynx_log_parse_level(const char *s);

#define LYNX_LOG_RL_BURST 10u
struct lynx__log_rl { /* a token bucket: LYNX_LOG_RL_BURST lines, 1 a second */
  uint64_t last_ns;
  uint32_t tokens;
  uint64_t suppressed;
};
/* 1 when a rate-limited line may be printed now; *suppressed gets the number
 * of lines skipped since the last one. */
int lynx__log_rl_allow(struct lynx__log_rl *rl, uint64_t *suppressed);

#define LYNX_LOG(lvl, comp, ...)                                               \
  do {                                                                         \
    if ((lvl) <= lynx_log_level)                                               \
      lynx__log((lvl), (comp), __VA_ARGS__);                                   \
  } while (0)

#define LYNX_LOG_RL(lvl, comp, fmt, ...)                                       \
  do {                                                                         \
    static __thread struct lynx__log_rl lynx__rl_;                             \
    uint64_t lynx__sup_;                                                       \
    if ((lvl) <= lynx_log_level &&                                             \
        lynx__log_rl_allow(&lynx__rl_, &lynx__sup_))                           \
      lynx__log((lvl), (comp), fmt " (%llu similar suppressed)",               \
                ##__VA_ARGS__, (unsigned long long)lynx__sup_);                \
  } while (0)

#define LYNX_ERR(comp, ...) LYNX_LOG(LYNX_LOG_ERROR, comp, __VA_ARGS__)
#define LYNX_WARN(comp, ...) LYNX_LOG(LYNX_LOG_WARN, comp, __VA_ARGS__)
#define LYNX_INFO(comp, ...) LYNX_LOG(LYNX_LOG_INFO, comp, __VA_ARGS__)
#define LYNX_DBG(comp, ...) LYNX_LOG(LYNX_LOG_DEBUG, comp, __VA_ARGS__)

#endif
