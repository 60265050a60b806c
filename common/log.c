/* log.c - see log.h. One write(2) per line so lines from threads and
 * processes sharing a terminal do not interleave. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

int lynx_log_level = LYNX_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int lynx_log_parse_level(const char *s) {
  for (int i = 0; i < 4; i++)
    if (strcmp(s, level_names[i]) == 0)
      return i;
  return -EINVAL;
}

void lynx__log(int level, const char *comp, const char *fmt, ...) {
  char line[1024];
  struct timespec ts;
  struct tm tm;
  size_t n;
  va_list ap;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  n = strftime(line, sizeof(line), "%H:%M:%S", &tm);
  n += (size_t)snprintf(line + n, sizeof(line) - n,
                        ".%03ld %-5s %s: ", ts.tv_nsec / 1000000,
                        level_names[level & 3], comp);
  va_start(ap, fmt);
  if (n < sizeof(line))
    n += (size_t)vsnprintf(line + n, sizeof(line) - n, fmt, ap);
  va_end(ap);
  if (n >= sizeof(line) - 1)
    n = sizeof(line) - 2;
  line[n++] = '\n';
  (void)!write(STDERR_FILENO, line, n);
}

int lynx__log_rl_allow(struct lynx__log_rl *rl, uint64_t *suppressed) {
  uint64_t now = lynx_now_ns(), add;
  if (!rl->last_ns) {
    rl->tokens = LYNX_LOG_RL_BURST;
    rl->last_ns = now;
  }
  add = (now - rl->last_ns) / 1000000000ull;
  if (add) { /* one line a second comes back, up to the burst */
    rl->tokens = add >= LYNX_LOG_RL_BURST - rl->tokens
                     ? LYNX_LOG_RL_BURST
                     : rl->tokens + (uint32_t)add;
    rl->last_ns += add * 1000000000ull;
  }
  if (!rl->tokens) {
    rl->suppressed++;
    return 0;
  }
  rl->tokens--;
  *suppressed = rl->suppressed;
  rl->suppressed = 0;
  return 1;
}
