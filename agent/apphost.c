/*
 * apphost.c - plug-in applications in processes of their own, so that a
 * plug-in that crashes, exits or hangs takes down nothing but itself
 * (docs/writing-apps.md, "Faults").
 *
 * Each plug-in the agent loads gets a process: lynx-agent --app-host,
 * started from this very program (/proc/self/exe) with a SOCK_SEQPACKET
 * socket as fd 3. It loads the plug-in itself (lynx_app_load: a
 * constructor that crashes crashes it, not the agent), says what it loaded
 * (HELLO), and then runs the CPU accelerator threads of every instance of
 * that application (START, STOP), over memory the agent shares with it:
 *
 *   - the instance's region: the memory file the transport allocated it in
 *     (transport.c lynx_region_map_served), passed as a descriptor;
 *   - a page of its own per instance (struct ah_shared): the lease fence
 *     (serve_until, which the agent moves and the threads read live, as
 *     they read the agent's own in-process), the threads' counters and
 *     latency (read by the agent as a CPU instance's are), and per mqueue
 *     the position after the last request taken.
 *
 * Nothing of the data path crosses the socket: requests and answers stay
 * in the region, doorbells are futexes in it and Unix datagrams to
 * frontends' bells, which any process can ring. The process dies with the
 * agent (PR_SET_PDEATHSIG) and runs in a process group of its own, killed
 * with it; the agent watches it through a pidfd and never trusts what it
 * can write (the region's header, the shared page) to size anything.
 *
 * When the process dies (or is killed: it hung, answered late, closed its
 * socket), what each instance had taken and not finished is dropped (its
 * tags freed: those requests never run again, at most once holds) and
 * counted lost, and a new process is started after a backoff (100 ms,
 * doubling to 30 s while it keeps dying within a minute of its start)
 * which takes the same instances over on the same regions: their
 * descriptors do not change, requests that queued meanwhile are served,
 * frontends notice nothing but the pause. Nothing of it waits in the loop:
 * HELLO and STARTED are events. An instance the new process cannot start
 * is reported failed to the coordinator (in static mode, tried again).
 *
 * Everything here runs on the agent's loop thread (and before the loop,
 * at start); the metrics thread reads the counters atomically.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "bell.h"
#include "lynx.pb-c.h"
#include "cpu_accel.h"
#include "log.h"
#include "prom.h"
#include "util.h"

extern char **environ;

#define AH_FD 3           /* the socket, in the process */
#define AH_HELLO_MS 10000 /* a process's load, at most */
/* an instance's start (the app's start: waited for in static mode only;
 * under a coordinator its reply is an event) and its stop: past them the
 * process is killed */
#define AH_START_MS 5000
#define AH_STOP_MS 2000
#define AH_SPAWN_TRIES 3       /* new processes that never come up: give up */
#define AH_BACKOFF_MIN_MS 100u /* first restart after a death */
#define AH_BACKOFF_MAX_MS 30000u
#define AH_STABLE_MS 60000u /* alive this long: the next death starts over */

enum ah_type { AH_HELLO = 1, AH_START, AH_STARTED, AH_STOP, AH_STOPPED };

struct ah_hello {
  uint32_t type, ok;
  char name[LYNX_APP_NAME_MAX];
  char help[256];
  char backend[LYNX_BACKEND_NAME_MAX];
  char reason[LYNX_APP_REFUSAL_MAX];
};

/* Sent up to its configuration's NUL (ah_start_len): most are small. */
struct ah_start {
  uint32_t type, resume; /* resume: a new process takes the instance over */
  uint64_t handle;       /* the agent's name for the instance */
  uint64_t region_size, shared_size;
  uint32_t n_server, work_us, work_sleep, spin_us, n_threads, accel_id;
  char service[LYNX_ID_MAX];
  uint32_t n_backends;
  char backends[LYNX_BACKENDS_MAX][LYNX_BACKEND_NAME_MAX];
  char config[LYNX_APP_CONFIG_MAX]; /* last */
};

static size_t ah_start_len(const struct ah_start *s) {
  return offsetof(struct ah_start, config) +
         strnlen(s->config, sizeof(s->config) - 1) + 1;
}

struct ah_reply {
  uint32_t type;
  int32_t rc;
  uint64_t handle;
  char why[320];
};

struct ah_stop {
  uint32_t type;
  uint64_t handle;
};

/* The page an instance's process and the agent share. */
struct ah_shared {
  uint64_t serve_until; /* the lease fence (lynx_now_ns clock) */
  uint32_t n_threads;
  uint32_t taken[LYNX_MQUEUES_MAX];
  struct lynx_cpu_thread threads[];
};

/* A watch on one of a process's descriptors (freed once closed). */
struct ah_watch {
  uv_poll_t poll;
  struct app_host *h;
  int pid; /* 1: its pidfd (readable: it ended); 0: its socket */
};

struct ah_inst;

enum ah_state {
  AH_DOWN,     /* no process: a restart is due (or the agent stops) */
  AH_SPAWNING, /* started again, its HELLO not in yet (loop) */
  AH_UP,       /* serving */
};

struct app_host {
  struct agent *ag;
  char name[LYNX_APP_NAME_MAX];
  char path[4096];
  enum ah_state state;
  int sock;  /* -1: no process */
  int pidfd; /* -1: none (then the socket's end is the process's) */
  pid_t pid; /* 0: none; also its process group (the process's children) */
  struct ah_watch *sw, *pw;
  uint64_t started_ns;     /* the current process's start */
  uint32_t deaths;         /* in a row (each within AH_STABLE_MS of start) */
  uint32_t spawn_failures; /* new processes in a row that never came up */
  uv_timer_t restart;      /* the backoff, then HELLO's deadline */
  int timer_on;
  /* totals for --metrics (read by its thread) */
  uint64_t restarts, lost;
  char last_death[160];
  char kill_why[160]; /* why the agent killed the process ("": it did not) */
  struct ah_inst *insts;
  struct app_host *next;
};

struct ah_inst {
  struct lynx_accel_inst base;
  struct app_host *h;
  uint64_t handle;
  struct ah_start start; /* kept: sent again to a new process */
  uint8_t *region;       /* the agent's mapping */
  struct lynx_geom g;    /* its geometry, the agent's (never the header's) */
  struct lynx_region_hdr hdr; /* its header as started: restored when a
                                 process that died wrote over it */
  int region_fd;
  struct ah_shared *sh;
  int sh_fd;
  int running;  /* the current process serves it */
  int starting; /* a START sent, its reply not in yet */
  int to_start; /* a START to send (the socket was full, or a retry) */
  /* when it was sent (the deadline is AH_START_MS later), or when it is
   * to be sent (to_start) */
  uint64_t start_ns;
  uint32_t start_deaths;   /* processes that died while starting it */
  uint32_t start_refusals; /* static mode: takeovers its start refused */
  int hdr_valid;
  struct lynx_cpu_accel view; /* threads and n_threads over sh, for counters */
  struct ah_inst *next;
};

extern const struct lynx_accel_ops lynx_accel_apphost;

/* ---- the socket --------------------------------------------------------- */

/* Sends len bytes and up to two descriptors (-1: none); the agent's sends
 * never wait (a process that reads nothing is a fault, not a reason to
 * block the agent), the process's do (wait). 0 or -errno. */
static int ah_send_how(int sock, const void *msg, size_t len, int fd1, int fd2,
                       int wait) {
  char cbuf[CMSG_SPACE(2 * sizeof(int))];
  struct iovec iov = {(void *)msg, len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  int fds[2] = {fd1, fd2}, n = (fd1 >= 0) + (fd2 >= 0);
  ssize_t w;
  if (n) {
    struct cmsghdr *c;
    memset(cbuf, 0, sizeof(cbuf));
    mh.msg_control = cbuf;
    mh.msg_controllen = CMSG_SPACE(n * sizeof(int));
    c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n * sizeof(int));
    memcpy(CMSG_DATA(c), fds, n * sizeof(int));
  }
  do
    w = sendmsg(sock, &mh, MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT));
  while (w < 0 && errno == EINTR);
  return w == (ssize_t)len ? 0 : w < 0 ? -errno : -EMSGSIZE;
}

static int ah_send(int sock, const void *msg, size_t len, int fd1, int fd2) {
  return ah_send_how(sock, msg, len, fd1, fd2, 0);
}

/* One message into buf (at most len bytes), its descriptors into fds
 * (room for two; -1 where none), waiting until deadline_ns (0: forever).
 * The bytes, 0 when the peer closed, or -errno (-ETIMEDOUT). */
static ssize_t ah_recv(int sock, void *buf, size_t len, int *fds,
                       uint64_t deadline_ns) {
  char cbuf[CMSG_SPACE(2 * sizeof(int))];
  struct iovec iov = {buf, len};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = cbuf,
                      .msg_controllen = sizeof(cbuf)};
  struct pollfd p = {sock, POLLIN, 0};
  ssize_t n;
  if (fds)
    fds[0] = fds[1] = -1;
  for (;;) {
    uint64_t now = lynx_now_ns();
    int ms = deadline_ns ? (now >= deadline_ns
                                ? 0
                                : (int)((deadline_ns - now) / 1000000u) + 1)
                         : -1;
    int r = poll(&p, 1, ms);
    if (r > 0)
      break;
    if (r == 0)
      return -ETIMEDOUT;
    if (errno != EINTR)
      return -errno;
  }
  do
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return errno == EAGAIN ? -ETIMEDOUT : -errno;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      int tmp[2] = {-1, -1};
      memcpy(tmp, CMSG_DATA(c), (size_t)(got > 2 ? 2 : got) * sizeof(int));
      for (int i = 0; i < got && i < 2; i++) {
        if (fds)
          fds[i] = tmp[i];
        else
          close(tmp[i]);
      }
    }
  return n;
}

/* ---- the process, from the agent's side -------------------------------- */

static void host_died(struct app_host *h, const char *how);
static void handle_msg(struct app_host *h, const void *buf, size_t n);
static void watch_starts(struct app_host *h);
static void pump_starts(struct app_host *h);

/* The process is at fault (it did not answer, sent garbage, closed its
 * socket): killed with its children, and host_died follows when its pidfd
 * says it ended. */
static void host_kill(struct app_host *h, const char *why) {
  if (!h->pid)
    return;
  if (!h->kill_why[0]) {
    snprintf(h->kill_why, sizeof(h->kill_why), "%s", why);
    LYNX_ERR("agent", "application '%s': %s: its process %d is killed", h->name,
             why, (int)h->pid);
  }
  kill(-h->pid, SIGKILL);
  kill(h->pid, SIGKILL);
}

/* 1 when the process has ended (not reaped: reap says how), waiting up
 * to 100 ms for it: a socket closes as its process exits, and the pidfd
 * may be seen a turn of the loop later. */
static int proc_ended(struct app_host *h) {
  for (int i = 0; i < 100 && h->pid; i++) {
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PID, (id_t)h->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        si.si_pid == h->pid)
      return 1;
    usleep(1000);
  }
  return !h->pid;
}

/* A reply to handle: 0, the process's -errno with its reason in why, or
 * -EPIPE (the process closed) / -ETIMEDOUT (it is killed). Other messages
 * that come meanwhile (replies to takeovers) are handled as they would be
 * in the loop. */
static int ah_wait_reply(struct app_host *h, uint32_t type, uint64_t handle,
                         int timeout_ms, char *why, size_t whylen) {
  uint64_t end = lynx_now_ns() + (uint64_t)timeout_ms * 1000000u;
  for (;;) {
    struct ah_reply r;
    ssize_t n = ah_recv(h->sock, &r, sizeof(r), NULL, end);
    if (n == -ETIMEDOUT) {
      snprintf(why, whylen, "its process did not answer within %d ms",
               timeout_ms);
      host_kill(h, why);
      return -ETIMEDOUT;
    }
    if (n <= 0) {
      snprintf(why, whylen, "its process ended (%s)",
               n == 0 ? "it closed its connection" : strerror((int)-n));
      if (!proc_ended(h)) /* else its pidfd says so in the loop */
        host_kill(h, "it closed its connection to the agent");
      return -EPIPE;
    }
    if ((size_t)n != sizeof(r) || r.type != type || r.handle != handle) {
      handle_msg(h, &r, (size_t)n);
      continue;
    }
    if (r.rc) {
      r.why[sizeof(r.why) - 1] = 0;
      snprintf(why, whylen, "%s", r.why);
      return r.rc < 0 ? r.rc : -EPROTO;
    }
    return 0;
  }
}

static void watch_closed(uv_handle_t *hd) { free(hd->data); }

static void on_fd(uv_poll_t *p, int status, int events);

static struct ah_watch *watch_on(struct app_host *h, int fd, int pid) {
  struct ah_watch *w = calloc(1, sizeof(*w));
  if (!w)
    return NULL;
  w->h = h;
  w->pid = pid;
  w->poll.data = w;
  if (uv_poll_init(&h->ag->loop, &w->poll, fd)) {
    free(w);
    return NULL;
  }
  if (uv_poll_start(&w->poll, UV_READABLE | UV_DISCONNECT, on_fd)) {
    uv_close((uv_handle_t *)&w->poll, watch_closed);
    return NULL;
  }
  return w;
}

static void watch_off(struct ah_watch **w) {
  if (!*w)
    return;
  uv_poll_stop(&(*w)->poll);
  uv_close((uv_handle_t *)&(*w)->poll, watch_closed);
  *w = NULL;
}

/* Watches the process once the loop runs: its end (pidfd) and what it
 * says (socket). Without either, it is killed: a process whose end the
 * agent would not see must not serve. */
static void watch_start(struct app_host *h) {
  if (h->sock < 0 || !h->ag->loop_ready)
    return;
  if (!h->sw)
    h->sw = watch_on(h, h->sock, 0);
  if (!h->pw && h->pidfd >= 0)
    h->pw = watch_on(h, h->pidfd, 1);
  if (!h->sw || (h->pidfd >= 0 && !h->pw))
    host_kill(h, "the agent cannot watch it (out of memory)");
}

static void on_fd(uv_poll_t *p, int status, int events) {
  struct ah_watch *w = container_of(p, struct ah_watch, poll);
  struct app_host *h = w->h;
  (void)events;
  if (w->pid || (status < 0 && h->pidfd < 0)) {
    host_died(h, NULL); /* it ended (or, without a pidfd, its socket did) */
    return;
  }
  for (int i = 0; i < 16 && h->sock >= 0; i++) { /* a few, then the loop */
    union {
      struct ah_hello hello;
      struct ah_reply reply;
    } m;
    ssize_t n = ah_recv(h->sock, &m, sizeof(m), NULL, lynx_now_ns());
    if (n == -ETIMEDOUT)
      return;
    if (n <= 0) {
      /* its end, or a process that closed its socket and lives on */
      if (h->pidfd < 0 || proc_ended(h))
        host_died(h, NULL);
      else
        host_kill(h, "it closed its connection to the agent");
      return;
    }
    handle_msg(h, &m, (size_t)n);
  }
}

/* How the process ended, into buf; reaps it. */
static void reap(struct app_host *h, char *buf, size_t len) {
  int st = 0;
  pid_t r = 0;
  for (int i = 0; i < 200 && (r = waitpid(h->pid, &st, WNOHANG)) == 0; i++)
    usleep(1000);
  if (r == 0) {
    kill(-h->pid, SIGKILL);
    kill(h->pid, SIGKILL);
    r = waitpid(h->pid, &st, 0);
    snprintf(buf, len, "closed its connection to the agent (killed)");
  } else if (r < 0) {
    snprintf(buf, len, "ended (%s)", strerror(errno));
  } else if (WIFSIGNALED(st)) {
    snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st),
             strsignal(WTERMSIG(st)));
  } else {
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
  }
  kill(-h->pid, SIGKILL); /* whatever it left: they share its region */
  h->pid = 0;
}

static void close_proc(struct app_host *h) {
  watch_off(&h->sw);
  watch_off(&h->pw);
  if (h->sock >= 0)
    close(h->sock);
  if (h->pidfd >= 0)
    close(h->pidfd);
  h->sock = h->pidfd = -1;
}

/* Starts the process (its own process group, its socket as AH_FD, a pidfd
 * on it): 0, or -errno with the reason in why. */
static int host_exec(struct app_host *h, const char *want, char *why,
                     size_t whylen) {
  int sv[2], child, rc;
  char level[16], parent[24];
  char *argv[] = {
      "lynx-agent", "--app-host", h->path, (char *)(want ? want : ""),
      level,        parent,       NULL};
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  snprintf(level, sizeof(level), "%d", lynx_log_level);
  snprintf(parent, sizeof(parent), "%d", (int)getpid());
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
    rc = -errno;
    snprintf(why, whylen, "cannot make its socket: %s", strerror(-rc));
    return rc;
  }
  /* above AH_FD, so that the dup2 below always clears close-on-exec */
  child = fcntl(sv[1], F_DUPFD_CLOEXEC, AH_FD + 1);
  close(sv[1]);
  if (child < 0) {
    rc = -errno;
    close(sv[0]);
    snprintf(why, whylen, "cannot make its socket: %s", strerror(-rc));
    return rc;
  }
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, child, AH_FD);
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&at, 0);
  rc = posix_spawn(&h->pid, "/proc/self/exe", &fa, &at, argv, environ);
  posix_spawnattr_destroy(&at);
  posix_spawn_file_actions_destroy(&fa);
  close(child);
  if (rc) {
    close(sv[0]);
    h->pid = 0;
    snprintf(why, whylen, "cannot start its process: %s", strerror(rc));
    return -rc;
  }
  h->sock = sv[0];
  /* its end, seen even when something it forked keeps its socket open */
  h->pidfd = (int)syscall(SYS_pidfd_open, h->pid, 0);
  if (h->pidfd >= 0)
    fcntl(h->pidfd, F_SETFD, FD_CLOEXEC);
  h->started_ns = lynx_now_ns();
  h->kill_why[0] = 0;
  return 0;
}

/* A HELLO's texts, checked: 0, or -EPROTO with the reason in why. */
static int hello_check(struct ah_hello *hello, char *why, size_t whylen) {
  hello->name[sizeof(hello->name) - 1] = 0;
  hello->help[sizeof(hello->help) - 1] = 0;
  hello->backend[sizeof(hello->backend) - 1] = 0;
  hello->reason[sizeof(hello->reason) - 1] = 0;
  for (char *c = hello->help; *c; c++)
    if ((unsigned char)*c < 0x20)
      *c = ' '; /* shown on one line */
  for (char *c = hello->reason; *c; c++)
    if ((unsigned char)*c < 0x20)
      *c = ' ';
  if (!lynx_app_name_ok(hello->name) ||
      (hello->backend[0] && !lynx_app_name_ok(hello->backend))) {
    snprintf(why, whylen, "its process said no valid name");
    return -EPROTO;
  }
  return 0;
}

/* host_exec, then its HELLO (before the loop runs: the agent's start). 0,
 * or -errno with the reason in why (when the process refused the plug-in,
 * hello says under which name, and why is its reason). */
static int host_spawn(struct app_host *h, const char *want,
                      struct ah_hello *hello, char *why, size_t whylen) {
  ssize_t n;
  int rc;
  memset(hello, 0, sizeof(*hello));
  rc = host_exec(h, want, why, whylen);
  if (rc)
    return rc;
  n = ah_recv(h->sock, hello, sizeof(*hello), NULL,
              lynx_now_ns() + (uint64_t)AH_HELLO_MS * 1000000u);
  if (n != (ssize_t)sizeof(*hello) || hello->type != AH_HELLO) {
    char how[160];
    if (n > 0 || n == -ETIMEDOUT)
      kill(-h->pid, SIGKILL), kill(h->pid, SIGKILL);
    reap(h, how, sizeof(how));
    close_proc(h);
    snprintf(why, whylen, "its process %s while loading it",
             n == -ETIMEDOUT ? "did not answer within 10 s"
             : n > 0         ? "said something else than what it loaded"
                             : how);
    memset(hello, 0, sizeof(*hello));
    return n == -ETIMEDOUT ? -ETIMEDOUT : -ECHILD;
  }
  if (hello->ok && hello_check(hello, why, whylen) == 0) {
    h->state = AH_UP;
    return 0;
  }
  if (!hello->ok) {
    hello->reason[sizeof(hello->reason) - 1] = 0;
    hello->name[sizeof(hello->name) - 1] = 0;
    if (!lynx_app_name_ok(hello->name))
      hello->name[0] = 0;
    snprintf(why, whylen, "%s", hello->reason);
  }
  {
    char how[160];
    close_proc(h); /* it exits */
    reap(h, how, sizeof(how));
  }
  return hello->ok ? -EPROTO : -EINVAL;
}

int agent_apphost_load(void *arg, const char *name, const char *path, char *why,
                       size_t whylen) {
  struct agent *ag = arg;
  struct ah_hello hello;
  struct app_host *h;
  char reason[LYNX_APP_REFUSAL_MAX], stem[LYNX_APP_NAME_MAX];
  int rc;
  lynx_app_file_stem(path, stem, sizeof(stem));
  /* what can be said without running any of it, here */
  rc = lynx_app_check_file(path, reason, sizeof(reason));
  if (rc) {
    lynx_app_refuse(name ? name : stem, reason);
    snprintf(why, whylen, "%s: %s", path, reason);
    return rc;
  }
  h = calloc(1, sizeof(*h));
  if (!h) {
    snprintf(why, whylen, "%s: out of memory", path);
    return -ENOMEM;
  }
  h->ag = ag;
  h->sock = h->pidfd = -1;
  snprintf(h->path, sizeof(h->path), "%s", path);
  rc = host_spawn(h, name, &hello, reason, sizeof(reason));
  if (rc) {
    /* the process's own refusal names the app as it would have */
    lynx_app_refuse(name ? name : hello.name[0] ? hello.name : stem, reason);
    snprintf(why, whylen, "%s: %s", path, reason);
    free(h);
    return rc;
  }
  snprintf(h->name, sizeof(h->name), "%s", hello.name);
  rc = lynx_app_add_hosted(hello.name, hello.help, hello.backend, path,
                           &lynx_accel_apphost, h, reason, sizeof(reason));
  if (rc) {
    snprintf(why, whylen, "%s: %s", path, reason);
    close_proc(h);
    reap(h, reason, sizeof(reason));
    free(h);
    return rc;
  }
  h->next = ag->apphosts;
  ag->apphosts = h;
  LYNX_INFO("agent",
            "application '%s' loaded from %s, served by its own process "
            "(pid %d)",
            h->name, path, (int)h->pid);
  return 0;
}

void agent_apphosts_start(struct agent *ag) {
  for (struct app_host *h = ag->apphosts; h; h = h->next) {
    uv_timer_init(&ag->loop, &h->restart);
    h->restart.data = h;
    h->timer_on = 1;
    watch_start(h);
  }
}

static struct instance *instance_of(struct agent *ag, struct ah_inst *ai) {
  for (struct instance *in = ag->instances; in; in = in->next)
    if (in->run == &ai->base)
      return in;
  return NULL;
}

/* An instance no process can serve: reported failed to the coordinator,
 * which places it again with its backoff, and stopped here (its region
 * freed). In static mode its start is tried again later. */
static void inst_failed(struct app_host *h, struct ah_inst *ai,
                        const char *why) {
  struct agent *ag = h->ag;
  struct instance *in = instance_of(ag, ai);
  LYNX_ERR("agent", "application '%s': instance %llu not taken over: %s",
           h->name, in ? (unsigned long long)in->id : 0ull, why);
  if (in && ag->report_failed) {
    ag->report_failed(ag, in->id, why);
    agent_instance_stop(ag, in); /* unlinks ai (stop), frees it (put) */
    return;
  }
  /* static mode: nobody to place it again; tried again, 1 s doubling to
   * 30 s (start_watch sends it when due) */
  {
    uint64_t ms = 1000ull << (ai->start_refusals < 5 ? ai->start_refusals : 5);
    ai->start_refusals++;
    ai->to_start = 1;
    ai->start_ns = lynx_now_ns() + (ms > 30000 ? 30000 : ms) * 1000000u;
    watch_starts(h);
  }
}

/* The process that took over says it serves an instance (or cannot). */
static void on_started(struct app_host *h, const struct ah_reply *r) {
  for (struct ah_inst *ai = h->insts; ai; ai = ai->next) {
    struct instance *in;
    char why[330];
    if (ai->handle != r->handle || !ai->starting)
      continue;
    ai->starting = 0;
    ai->running = r->rc == 0;
    memcpy(why, r->why, sizeof(r->why));
    why[sizeof(r->why) - 1] = 0;
    in = instance_of(h->ag, ai);
    if (in && in->pending) /* its first start: ready, or failed */
      agent_instance_started(h->ag, in, r->rc, why);
    else if (r->rc)
      inst_failed(h, ai, why);
    else
      ai->start_deaths = ai->start_refusals = 0;
    pump_starts(h);
    return;
  }
}

/* Every second while starts are out: one past AH_START_MS is a process
 * that hangs in the application's start. */
static void start_watch(uv_timer_t *t) {
  struct app_host *h = t->data;
  uint64_t now = lynx_now_ns();
  int out = 0;
  if (h->state != AH_UP)
    return;
  for (struct ah_inst *ai = h->insts; ai; ai = ai->next) {
    out |= ai->starting || ai->to_start;
    if (ai->starting && now - ai->start_ns > (uint64_t)AH_START_MS * 1000000u) {
      host_kill(h, "an instance's start took longer than 5 s");
      return;
    }
  }
  if (!out) {
    uv_timer_stop(&h->restart);
    return;
  }
  pump_starts(h); /* retries now due, STARTs the socket had no room for */
}

static void watch_starts(struct app_host *h) {
  if (h->timer_on && !uv_is_active((uv_handle_t *)&h->restart))
    uv_timer_start(&h->restart, start_watch, 1000, 1000);
}

/* Sends the STARTs that wait (to_start, due), as far as the socket takes
 * them: a full socket is back-pressure (the next reply frees room and
 * calls this again, as start_watch does every second), any other error a
 * fault. */
static void pump_starts(struct app_host *h) {
  uint64_t now = lynx_now_ns();
  if (h->state != AH_UP)
    return;
  for (struct ah_inst *ai = h->insts; ai; ai = ai->next) {
    int rc;
    if (!ai->to_start || now < ai->start_ns)
      continue;
    rc = ah_send(h->sock, &ai->start, ah_start_len(&ai->start), ai->region_fd,
                 ai->sh_fd);
    if (rc == -EAGAIN || rc == -ENOBUFS)
      break;
    if (rc) {
      host_kill(h, "it takes no request to start an instance");
      return;
    }
    ai->to_start = 0;
    ai->starting = 1;
    ai->start_ns = now;
  }
  watch_starts(h);
}

/* The new process is up: it takes every instance over, without the loop
 * waiting for any (the replies come to on_fd). */
static void take_over(struct app_host *h) {
  uint64_t now = lynx_now_ns();
  uint32_t n = 0;
  h->state = AH_UP;
  h->spawn_failures = 0;
  if (h->timer_on)
    uv_timer_stop(&h->restart);
  __atomic_add_fetch(&h->restarts, 1, __ATOMIC_RELAXED);
  for (struct ah_inst *ai = h->insts; ai; ai = ai->next) {
    if (ai->running || ai->starting)
      continue;
    ai->start.resume = 1;
    ai->to_start = 1;
    ai->start_ns = now;
    n++;
  }
  pump_starts(h);
  LYNX_INFO("agent",
            "application '%s': process %d takes over %u instance(s) "
            "(restart %llu)",
            h->name, (int)h->pid, n, (unsigned long long)h->restarts);
}

static void handle_msg(struct app_host *h, const void *buf, size_t n) {
  uint32_t type;
  if (n < sizeof(type) || h->kill_why[0]) /* a killed process says nothing */
    return;
  memcpy(&type, buf, sizeof(type));
  if (type == AH_HELLO && n == sizeof(struct ah_hello) &&
      h->state == AH_SPAWNING) {
    struct ah_hello hello;
    char why[LYNX_APP_REFUSAL_MAX + 64];
    memcpy(&hello, buf, sizeof(hello));
    if (!hello.ok || hello_check(&hello, why, sizeof(why)) ||
        strcmp(hello.name, h->name)) {
      snprintf(why, sizeof(why), "it no longer loads as '%s' (%.200s)", h->name,
               hello.ok ? hello.name : hello.reason);
      host_kill(h, why);
      return;
    }
    take_over(h);
  } else if (type == AH_STARTED && n == sizeof(struct ah_reply)) {
    struct ah_reply r;
    memcpy(&r, buf, sizeof(r));
    on_started(h, &r);
  } /* else: a late reply to a request that timed out (then killed) */
}

/* The HELLO of a new process did not come in time. */
static void hello_late(uv_timer_t *t) {
  struct app_host *h = t->data;
  if (h->state == AH_SPAWNING)
    host_kill(h, "it did not say what it loaded within 10 s");
}

static void restart_fired(uv_timer_t *t) {
  struct app_host *h = t->data;
  char why[320];
  if (h->ag->stopping || h->state != AH_DOWN)
    return;
  if (host_exec(h, h->name, why, sizeof(why))) {
    host_died(h, why); /* tried again later */
    return;
  }
  h->state = AH_SPAWNING;
  watch_start(h);
  uv_timer_start(&h->restart, hello_late, AH_HELLO_MS, 0);
}

/* The process is gone (how: why it could not be started; NULL: it ended):
 * what its instances had in hand is dropped, and a new one is started
 * after the backoff; after AH_SPAWN_TRIES new processes that never came
 * up, the instances are reported failed. */
static void host_died(struct app_host *h, const char *how) {
  struct agent *ag = h->ag;
  char death[160];
  uint64_t lost = 0, backoff, now = lynx_now_ns();
  uint32_t n = 0;
  int never_up = h->state != AH_UP;
  close_proc(h);
  if (how)
    snprintf(death, sizeof(death), "could not be started again: %.100s", how);
  else if (h->pid)
    reap(h, death, sizeof(death));
  else
    snprintf(death, sizeof(death), "ended");
  if (h->kill_why[0] && !how)
    snprintf(death, sizeof(death), "was killed: %.140s", h->kill_why);
  h->kill_why[0] = 0;
  h->state = AH_DOWN;
  for (struct ah_inst *ai = h->insts; ai; ai = ai->next) {
    if (!ai->running && !ai->starting)
      continue;
    ai->start_deaths += ai->starting;
    ai->running = ai->starting = 0;
    /* frontends and the next process read the header: the agent's own */
    if (ai->hdr_valid && memcmp(ai->region, &ai->hdr, sizeof(ai->hdr))) {
      LYNX_WARN("agent",
                "application '%s': its process wrote over a region's "
                "header (%s): restored",
                h->name, ai->start.service);
      memcpy(ai->region, &ai->hdr, sizeof(ai->hdr));
    }
    lost += lynx_cpu_accel_drop_taken(ai->region, &ai->g, ai->start.n_server,
                                      ai->sh->taken);
    n++;
  }
  __atomic_add_fetch(&h->lost, lost, __ATOMIC_RELAXED);
  if (now - h->started_ns > (uint64_t)AH_STABLE_MS * 1000000u)
    h->deaths = 0;
  backoff = (uint64_t)AH_BACKOFF_MIN_MS << (h->deaths < 9 ? h->deaths : 9);
  if (backoff > AH_BACKOFF_MAX_MS)
    backoff = AH_BACKOFF_MAX_MS;
  h->deaths++;
  h->spawn_failures += never_up;
  snprintf(h->last_death, sizeof(h->last_death), "%s", death);
  LYNX_ERR("agent",
           "application '%s': its process %s; %u instance(s) lost %llu "
           "request(s) in hand (dropped), and are taken over by a new "
           "process in %llu ms",
           h->name, death, n, (unsigned long long)lost,
           (unsigned long long)backoff);
  /* an instance whose first start never ended is not taken over: it
   * failed (its start may be what kills the process) */
  for (struct ah_inst *ai = h->insts, *nx; ai; ai = nx) {
    struct instance *in = instance_of(ag, ai);
    char why[200];
    nx = ai->next;
    ai->to_start = 0; /* the next process takes it over, or nobody */
    if (in && in->pending) {
      snprintf(why, sizeof(why), "its process %s while starting it", death);
      agent_instance_started(ag, in, -EPIPE, why);
    } else if (ai->start_deaths >= 2) { /* its start is what kills them */
      snprintf(why, sizeof(why),
               "its process died twice while taking it over (last: %.120s)",
               death);
      inst_failed(h, ai, why);
    }
  }
  if (h->spawn_failures >= AH_SPAWN_TRIES)
    for (struct ah_inst *ai = h->insts, *nx; ai; ai = nx) {
      nx = ai->next;
      inst_failed(h, ai, death);
    }
  if (h->timer_on && !ag->stopping)
    uv_timer_start(&h->restart, restart_fired, backoff, 0);
}

int agent_apphost_hung(struct agent *ag, struct instance *in,
                       uint64_t stall_ms) {
  struct ah_inst *ai;
  struct app_host *h;
  char why[160];
  (void)ag;
  if (!in->run || in->run->ops != &lynx_accel_apphost)
    return 0;
  ai = container_of(in->run, struct ah_inst, base);
  h = ai->h;
  /* taken over soon (its process is being restarted): not a stall yet;
   * never taken over since (a process that cannot come up): a stall */
  if (!ai->running || !h->pid)
    return h->state != AH_DOWN || stall_ms < AH_BACKOFF_MAX_MS + AH_HELLO_MS;
  snprintf(why, sizeof(why),
           "it hung: instance %llu (%s) had a request pending %llu ms "
           "(--stall-ms)",
           (unsigned long long)in->id, in->service,
           (unsigned long long)stall_ms);
  host_kill(h, why);
  return 1;
}

void agent_apphosts_quiesce(struct agent *ag) {
  for (struct app_host *h = ag->apphosts; h; h = h->next) {
    if (h->timer_on)
      uv_close((uv_handle_t *)&h->restart, NULL);
    h->timer_on = 0;
    watch_off(&h->sw);
    watch_off(&h->pw);
  }
}

void agent_apphosts_stop(struct agent *ag) {
  while (ag->apphosts) {
    struct app_host *h = ag->apphosts;
    char how[160];
    ag->apphosts = h->next;
    if (h->sock >= 0)
      close(h->sock); /* it exits on the end of its socket */
    if (h->pidfd >= 0)
      close(h->pidfd);
    h->sock = h->pidfd = -1;
    if (h->pid)
      reap(h, how, sizeof(how));
    free(h);
  }
}

size_t agent_apphosts_faults(struct agent *ag, Lynx__AppFault *out) {
  size_t n = 0;
  for (struct app_host *h = ag->apphosts; h && n < LYNX_APP_FAULTS_MAX;
       h = h->next) {
    if (!h->last_death[0])
      continue;
    lynx__app_fault__init(&out[n]);
    out[n].name = h->name;
    out[n].last_death = h->last_death;
    out[n].restarts = h->restarts;
    out[n].lost = h->lost;
    n++;
  }
  return n;
}

void agent_apphosts_metrics(FILE *f, struct agent *ag) {
  if (!ag->apphosts)
    return;
  lynx_prom_family(f, "lynx_agent_app_restarts_total", "counter",
                   "Times a plug-in application's process was started "
                   "again after it died (docs/writing-apps.md, \"Faults\").");
  for (struct app_host *h = ag->apphosts; h; h = h->next)
    lynx_prom_u64(
        f, "lynx_agent_app_restarts_total",
        (const struct lynx_prom_label[]){{"app", h->name}, {NULL, NULL}},
        __atomic_load_n(&h->restarts, __ATOMIC_RELAXED));
  lynx_prom_family(f, "lynx_agent_app_lost_requests_total", "counter",
                   "Requests a plug-in application's process had taken and "
                   "not finished when it died: dropped, never run again.");
  for (struct app_host *h = ag->apphosts; h; h = h->next)
    lynx_prom_u64(
        f, "lynx_agent_app_lost_requests_total",
        (const struct lynx_prom_label[]){{"app", h->name}, {NULL, NULL}},
        __atomic_load_n(&h->lost, __ATOMIC_RELAXED));
}

/* ---- the ops table of an instance in a plug-in's process --------------- */

static int ah_discover(const char *spec, const struct lynx_transport_ops *tops,
                       enum lynx_region_where mem, struct lynx_accel_dev **out,
                       uint32_t *n, char *err, size_t errlen) {
  (void)spec, (void)tops, (void)mem;
  *out = NULL;
  *n = 0;
  snprintf(err, errlen, "a plug-in's process runs on CPU accelerators");
  return -ENOTSUP;
}

static int ah_runs_app(const struct lynx_accel_dev *a,
                       const struct lynx_app *app) {
  (void)a;
  return app->host != NULL;
}

/* A plug-in's process runs the code of its shared object only. */
static int ah_adopt(const struct lynx_accel_dev *devs, uint32_t n,
                    struct lynx_app *app, char *why, size_t whylen) {
  (void)devs, (void)n, (void)app, (void)why, (void)whylen;
  return -ENOTSUP;
}

static int ah_client_mqs(const struct lynx_accel_launch *l,
                         uint32_t *per_backend, char *why, size_t whylen) {
  return lynx_accel_cpu.client_mqs(l, per_backend, why, whylen);
}

static uint64_t next_handle;

static int ah_start(const struct lynx_accel_launch *l, struct lynx_region *r,
                    struct lynx_accel_inst **out, char *why, size_t whylen) {
  struct app_host *h = l->app->host;
  struct ah_inst *ai;
  uint32_t threads;
  size_t shsize;
  int rc;
  *out = NULL;
  if (h->state != AH_UP) {
    snprintf(why, whylen,
             "application '%s': its process is being started again after it "
             "%s",
             h->name, h->last_death);
    return -EAGAIN;
  }
  if (r->fd < 0 || !l->region) {
    snprintf(why, whylen,
             "its region is no memory file another process can "
             "map");
    return -ENOTSUP;
  }
  threads = l->cpu_threads ? l->cpu_threads : 1;
  if (threads > l->n_server)
    threads = l->n_server;
  shsize = lynx_align_up(sizeof(struct ah_shared) +
                             threads * sizeof(struct lynx_cpu_thread),
                         4096);
  ai = calloc(1, sizeof(*ai));
  if (!ai) {
    snprintf(why, whylen, "out of memory");
    return -ENOMEM;
  }
  ai->base.ops = &lynx_accel_apphost;
  ai->h = h;
  ai->handle = ++next_handle;
  ai->region = l->region;
  ai->region_fd = r->fd;
  if (lynx_geom_init(&ai->g, l->n_mqueues, l->slots, l->slot_size,
                     l->large_bytes)) {
    snprintf(why, whylen, "invalid geometry");
    free(ai);
    return -EINVAL;
  }
  /* sealed at its size: the process cannot shrink what the agent reads */
  ai->sh_fd =
      memfd_create("lynx-app-instance", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (ai->sh_fd < 0 || ftruncate(ai->sh_fd, (off_t)shsize) ||
      fcntl(ai->sh_fd, F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ||
      (ai->sh = mmap(NULL, shsize, PROT_READ | PROT_WRITE, MAP_SHARED,
                     ai->sh_fd, 0)) == MAP_FAILED) {
    rc = -errno;
    snprintf(why, whylen, "cannot share its counters: %s", strerror(-rc));
    if (ai->sh_fd >= 0)
      close(ai->sh_fd);
    free(ai);
    return rc;
  }
  ai->sh->serve_until = l->serve_until ? *l->serve_until : UINT64_MAX;
  ai->sh->n_threads = threads;
  ai->view.threads = ai->sh->threads;
  ai->view.n_threads = threads;
  ai->start = (struct ah_start){.type = AH_START,
                                .handle = ai->handle,
                                .region_size = r->size,
                                .shared_size = shsize,
                                .n_server = l->n_server,
                                .work_us = l->work_us,
                                .work_sleep = (uint32_t)l->work_sleep,
                                .spin_us = l->spin_us,
                                .n_threads = threads,
                                .accel_id = l->accel_id,
                                .n_backends = l->n_backends};
  snprintf(ai->start.service, sizeof(ai->start.service), "%s",
           l->service ? l->service : "");
  snprintf(ai->start.config, sizeof(ai->start.config), "%s",
           l->app_config ? l->app_config : "");
  for (uint32_t k = 0; k < l->n_backends && k < LYNX_BACKENDS_MAX; k++)
    snprintf(ai->start.backends[k], sizeof(ai->start.backends[k]), "%s",
             l->backends[k]);
  /* the header as the agent formatted it (with the flag the process's
   * start sets): what a process that died is made to give back */
  memcpy(&ai->hdr, ai->region, sizeof(ai->hdr));
  ai->hdr.flags |= LYNX_HDR_RESP_BELL;
  ai->hdr_valid = 1;
  rc = ah_send(h->sock, &ai->start, ah_start_len(&ai->start), ai->region_fd,
               ai->sh_fd);
  if ((rc == -EAGAIN || rc == -ENOBUFS) && l->async_ok) {
    ai->to_start = 1; /* sent when the socket has room (pump_starts) */
    ai->start_ns = lynx_now_ns();
    ai->next = h->insts;
    h->insts = ai;
    *out = &ai->base;
    watch_starts(h);
    return 1;
  } else if (rc) {
    snprintf(why, whylen, "cannot reach its process: %s", strerror(-rc));
    host_kill(h, "it takes no request to start an instance");
  } else if (l->async_ok) {
    /* its reply comes to on_fd (agent_instance_started), within
     * AH_START_MS or the process is killed (start_watch) */
    ai->starting = 1;
    ai->start_ns = lynx_now_ns();
    ai->next = h->insts;
    h->insts = ai;
    *out = &ai->base;
    watch_starts(h);
    return 1;
  } else { /* static mode: waited for, before the agent serves anything */
    rc = ah_wait_reply(h, AH_STARTED, ai->handle, AH_START_MS, why, whylen);
  }
  ai->running = rc == 0;
  if (rc) {
    munmap(ai->sh, shsize);
    close(ai->sh_fd);
    free(ai);
    return rc;
  }
  ai->next = h->insts;
  h->insts = ai;
  *out = &ai->base;
  return 0;
}

static int ah_fence(struct lynx_accel_inst *in, uint64_t serve_until_ns,
                    int wake) {
  struct ah_inst *ai = container_of(in, struct ah_inst, base);
  __atomic_store_n(&ai->sh->serve_until, serve_until_ns, __ATOMIC_RELEASE);
  if (wake)
    lynx_region_wake(ai->region);
  return 0;
}

static int ah_counters(struct lynx_accel_inst *in, uint64_t *req,
                       uint64_t *resp, uint64_t *drops, uint64_t *bad) {
  struct ah_inst *ai = container_of(in, struct ah_inst, base);
  lynx_cpu_accel_counters(&ai->view, req, resp, drops, bad);
  return 0;
}

static int ah_latency(struct lynx_accel_inst *in, struct lynx_lat *out) {
  lynx_cpu_accel_latency(&container_of(in, struct ah_inst, base)->view, out);
  return 0;
}

static void ah_copies(struct lynx_accel_inst *in,
                      struct lynx_accel_copies *out) {
  (void)in;
  memset(out, 0, sizeof(*out));
}

/* Out of its process's list first: whatever the process does now, this
 * instance is not taken over again. A process that does not stop it in
 * time is killed (its other instances are then taken over by the next). */
static int ah_stop(struct lynx_accel_inst *in) {
  struct ah_inst *ai = container_of(in, struct ah_inst, base);
  struct app_host *h = ai->h;
  struct ah_stop m = {AH_STOP, ai->handle};
  char why[320];
  int busy = 0;
  for (struct ah_inst **pp = &h->insts; *pp; pp = &(*pp)->next)
    if (*pp == ai) {
      *pp = ai->next;
      break;
    }
  if ((!ai->running && !ai->starting) || h->state != AH_UP)
    return 0;
  ai->running = ai->starting = 0;
  for (struct ah_inst *o = h->insts; o; o = o->next)
    busy |= o->starting;
  if (ah_send(h->sock, &m, sizeof(m), -1, -1))
    host_kill(h, "it takes no request to stop an instance");
  else if (busy) /* it stops this one after that start: not waited for
                    (its own mapping of the region outlives the agent's) */
    LYNX_INFO("agent",
              "application '%s': an instance stopped while its process "
              "starts another: not waited for",
              h->name);
  else /* a process that does not stop it in time is killed */
    (void)ah_wait_reply(h, AH_STOPPED, ai->handle, AH_STOP_MS, why,
                        sizeof(why));
  return 0;
}

static void ah_put(struct lynx_accel_inst *in) {
  struct ah_inst *ai = container_of(in, struct ah_inst, base);
  munmap(ai->sh, ai->start.shared_size);
  close(ai->sh_fd);
  free(ai);
}

static void ah_health(const struct lynx_accel_dev *a, int *lost, int *failed,
                      char *err, size_t errlen) {
  lynx_accel_cpu.health(a, lost, failed, err, errlen);
}

static int ah_blocks(const struct lynx_accel_dev *a, uint32_t threads,
                     uint32_t *resident, uint32_t *held) {
  return lynx_accel_cpu.blocks(a, threads, resident, held);
}

static void ah_shutdown(void) {}

const struct lynx_accel_ops lynx_accel_apphost =
    LYNX_ACCEL_OPS("cpu", "CPU", ah);

/* ---- the process itself (lynx-agent --app-host) ------------------------- */

struct child_inst {
  uint64_t handle;
  struct lynx_cpu_accel a;
  uint8_t *region;
  uint64_t region_size;
  struct ah_shared *sh;
  uint64_t sh_size;
  void *state;
  char backends[LYNX_BACKENDS_MAX][LYNX_BACKEND_NAME_MAX];
  struct child_inst *next;
};

static int child_start(const struct lynx_app *app, const struct ah_start *s,
                       int *fds, struct child_inst **list, char *why,
                       size_t whylen) {
  const char *bn[LYNX_BACKENDS_MAX];
  struct child_inst *c = calloc(1, sizeof(*c));
  const struct lynx_region_hdr *hd;
  struct lynx_geom g;
  int rc;
  if (!c) {
    snprintf(why, whylen, "out of memory");
    return -ENOMEM;
  }
  c->handle = s->handle;
  c->region_size = s->region_size;
  c->sh_size = s->shared_size;
  c->region =
      mmap(NULL, s->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  c->sh =
      mmap(NULL, s->shared_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
  if (c->region == MAP_FAILED || c->sh == MAP_FAILED) {
    rc = -errno;
    snprintf(why, whylen, "its process cannot map the region: %s",
             strerror(-rc));
    goto fail;
  }
  for (uint32_t k = 0; k < s->n_backends && k < LYNX_BACKENDS_MAX; k++) {
    memcpy(c->backends[k], s->backends[k], sizeof(c->backends[k]));
    c->backends[k][sizeof(c->backends[k]) - 1] = 0;
    bn[k] = c->backends[k];
  }
  hd = (const struct lynx_region_hdr *)c->region;
  if (lynx_geom_init(&g, hd->n_mqueues, hd->slots, hd->slot_size,
                     hd->large_bytes)) {
    snprintf(why, whylen, "its region has a bad geometry");
    rc = -EINVAL;
    goto fail;
  }
  rc = lynx_app_start(app, s->service, s->config, s->n_server,
                      lynx_slot_cap(g.slot_size), lynx_msg_cap(&g), bn,
                      s->n_backends, &c->state, why, whylen);
  if (rc)
    goto fail;
  c->a.region = c->region;
  c->a.app = app;
  c->a.app_state = c->state;
  c->a.work_us = s->work_us;
  c->a.work_sleep = (int)s->work_sleep;
  c->a.spin_us = s->spin_us;
  c->a.n_threads = s->n_threads;
  c->a.id = s->accel_id;
  c->a.n_server = s->n_server;
  c->a.backend_names = c->backends;
  c->a.serve_until = &c->sh->serve_until;
  c->a.threads_mem = c->sh->threads;
  c->a.taken = c->sh->taken;
  c->a.resume = (int)s->resume;
  /* the threads' counters go on from where the last process left them */
  rc = lynx_cpu_accel_start(&c->a);
  if (rc) {
    snprintf(why, whylen, "cannot start threads: %s", strerror(-rc));
    lynx_app_stop(app, c->state);
    goto fail;
  }
  c->next = *list;
  *list = c;
  return 0;
fail:
  if (c->region != MAP_FAILED && c->region)
    munmap(c->region, s->region_size);
  if (c->sh != MAP_FAILED && c->sh)
    munmap(c->sh, s->shared_size);
  free(c);
  return rc;
}

static void child_stop(const struct lynx_app *app, struct child_inst *c) {
  lynx_cpu_accel_stop(&c->a);
  lynx_app_stop(app, c->state);
  lynx_cpu_accel_free(&c->a);
  munmap(c->region, c->region_size);
  munmap(c->sh, c->sh_size);
  free(c);
}

int agent_app_host_main(int argc, char **argv) {
  static union {
    struct ah_start start;
    struct ah_stop stop;
    uint32_t type;
  } m;
  struct ah_hello hello = {.type = AH_HELLO};
  struct child_inst *list = NULL;
  const struct lynx_app *app = NULL, *a;
  char why[512];
  const char *name, *rname, *reason;
  if (argc != 6)
    return 2;
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with its agent */
  if (getppid() != (pid_t)atoi(argv[5]))
    return 1; /* it is gone already */
  /* its socket is its own: nothing it starts inherits it */
  fcntl(AH_FD, F_SETFD, FD_CLOEXEC);
  signal(SIGPIPE, SIG_IGN);
  lynx_log_level = atoi(argv[4]);
  name = argv[3][0] ? argv[3] : NULL;
  if (lynx_app_load(name, argv[2], why, sizeof(why)) == 0) {
    for (size_t i = 0; (a = lynx_app_at(i)); i++)
      if (a->dl)
        app = a;
  }
  if (app) {
    char title[16];
    hello.ok = 1;
    snprintf(hello.name, sizeof(hello.name), "%s", app->name);
    snprintf(hello.help, sizeof(hello.help), "%s", app->help);
    snprintf(hello.backend, sizeof(hello.backend), "%s",
             app->needs_backend ? app->needs_backend : "");
    snprintf(title, sizeof(title), "lynx:%s", app->name);
    prctl(PR_SET_NAME, title);
  } else if (lynx_app_refused_at(0, &rname, &reason)) {
    snprintf(hello.name, sizeof(hello.name), "%s", rname);
    snprintf(hello.reason, sizeof(hello.reason), "%s", reason);
  }
  if (ah_send_how(AH_FD, &hello, sizeof(hello), -1, -1, 1) || !app)
    return 0;
  for (;;) {
    struct ah_reply r = {0};
    int fds[2];
    ssize_t n = ah_recv(AH_FD, &m, sizeof(m), fds, 0);
    if (n <= 0)
      break; /* the agent is gone, or stops us */
    if (m.type == AH_START && (size_t)n > offsetof(struct ah_start, config) &&
        (size_t)n <= sizeof(m.start) && fds[0] >= 0 && fds[1] >= 0) {
      m.start.service[sizeof(m.start.service) - 1] = 0;
      ((char *)&m.start)[n - 1] = 0; /* the configuration ends here */
      m.start.config[sizeof(m.start.config) - 1] = 0;
      r.type = AH_STARTED;
      r.handle = m.start.handle;
      r.rc = child_start(app, &m.start, fds, &list, r.why, sizeof(r.why));
    } else if (m.type == AH_STOP && (size_t)n == sizeof(m.stop)) {
      r.type = AH_STOPPED;
      r.handle = m.stop.handle;
      for (struct child_inst **pp = &list; *pp; pp = &(*pp)->next)
        if ((*pp)->handle == m.stop.handle) {
          struct child_inst *c = *pp;
          *pp = c->next;
          child_stop(app, c);
          break;
        }
    } else {
      r.type = m.type + 1;
      r.rc = -EPROTO;
      snprintf(r.why, sizeof(r.why), "a malformed request to its process");
    }
    for (int i = 0; i < 2; i++)
      if (fds[i] >= 0)
        close(fds[i]);
    if (ah_send_how(AH_FD, &r, sizeof(r), -1, -1, 1))
      break;
  }
  while (list) {
    struct child_inst *c = list;
    list = c->next;
    child_stop(app, c);
  }
  lynx_apps_unload();
  return 0;
}
