/*
 * app_registry.c - the applications an agent runs (apps.h): the built-in
 * definitions, then plug-ins loaded from shared objects, each checked
 * before it is taken (its file's architecture, its entry, its ABI
 * version, its name) and kept with the reason when refused; the host
 * side of an application's ctx (back-end calls, logging); an instance's
 * start and stop.
 *
 * The registry changes only while the agent starts (before its loop
 * runs), so lookups take no lock.
 */
#include "apps.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "log.h"
#include "util.h"
#include "wire.h"

#define LOADED_MAX (LYNX_APPS_MAX - 16u) /* plug-ins one agent loads */
#define REFUSED_MAX 64u                  /* refusals kept */

struct refusal {
  char name[LYNX_APP_NAME_MAX];
  char reason[320];
};

static struct {
  pthread_once_t once;
  struct lynx_app builtin[16];
  size_t n_builtin;
  struct lynx_app loaded[LOADED_MAX];
  size_t n_loaded;
  struct refusal refused[REFUSED_MAX];
  size_t n_refused;
  char names[4096], cuda_names[4096];
} reg = {.once = PTHREAD_ONCE_INIT};

static void from_def(struct lynx_app *a, const struct lynx_app_def *d) {
  a->def = d;
  a->name = d->name;
  a->help = d->help ? d->help : "";
  a->needs_backend =
      d->needs_backend && d->needs_backend[0] ? d->needs_backend : NULL;
}

static void reg_init(void) {
  for (size_t i = 0; i < lynx_builtin_apps_n && i < 16; i++) {
    struct lynx_app *a = &reg.builtin[reg.n_builtin++];
    from_def(a, lynx_builtin_apps[i].def);
    a->cuda_app = lynx_builtin_apps[i].cuda_app;
    a->origin = "built in";
  }
}

static void reg_ready(void) { pthread_once(&reg.once, reg_init); }

const struct lynx_app *lynx_app_at(size_t i) {
  reg_ready();
  if (i < reg.n_builtin)
    return &reg.builtin[i];
  i -= reg.n_builtin;
  return i < reg.n_loaded ? &reg.loaded[i] : NULL;
}

const struct lynx_app *lynx_app_find(const char *name) {
  const struct lynx_app *a;
  for (size_t i = 0; (a = lynx_app_at(i)); i++)
    if (!strcmp(a->name, name))
      return a;
  return NULL;
}

static const char *names_of(char *buf, size_t len, int cuda_only) {
  const struct lynx_app *a;
  size_t l = 0;
  buf[0] = 0;
  for (size_t i = 0; (a = lynx_app_at(i)); i++)
    if (!cuda_only || a->cuda_app != LYNX_CUDA_APP_NONE || a->module)
      l = lynx_appendf(buf, len, l, ", ", "%s", a->name);
  return buf;
}

const char *lynx_app_names(void) {
  return names_of(reg.names, sizeof(reg.names), 0);
}

const char *lynx_app_cuda_names(void) {
  return names_of(reg.cuda_names, sizeof(reg.cuda_names), 1);
}

int lynx_app_name_ok(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (!n || n >= LYNX_APP_NAME_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    int alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '-' && c != '_' && c != '.')))
      return 0;
  }
  return 1;
}

/* ---- loading ------------------------------------------------------------ */

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#else
#define HOST_MACHINE EM_NONE /* another: dlopen alone says */
#endif

static const char *machine_name(unsigned m) {
  switch (m) {
  case EM_NONE:
    return "this machine";
  case EM_X86_64:
    return "x86-64";
  case EM_AARCH64:
    return "aarch64";
  case EM_386:
    return "i386";
  case EM_ARM:
    return "32-bit arm";
  case EM_RISCV:
    return "riscv";
  case EM_PPC64:
    return "ppc64";
  case EM_S390:
    return "s390x";
  case EM_CUDA:
    return "CUDA (a GPU's cubin)";
  default:
    return NULL;
  }
}

/* The file is an ELF shared object for this machine: 0, or -ENOEXEC with
 * what it is instead. */
static int elf_check(int fd, char *why, size_t whylen) {
  Elf64_Ehdr h;
  ssize_t n = pread(fd, &h, sizeof(h), 0);
  const char *m;
  if (n < (ssize_t)EI_NIDENT || memcmp(h.e_ident, ELFMAG, SELFMAG)) {
    uint32_t magic = 0;
    if (n >= 4)
      memcpy(&magic, &h, 4);
    snprintf(why, whylen, "%s",
             magic == 0xBA55ED50u
                 ? "a CUDA fatbin, not a shared object (a GPU module is "
                   "loaded by the CUDA backend)"
                 : "not an ELF file (a plug-in is a shared object)");
    return -ENOEXEC;
  }
  if (h.e_ident[EI_CLASS] != ELFCLASS64) {
    snprintf(why, whylen,
             "a 32-bit ELF file; this agent loads 64-bit %s shared objects",
             machine_name(HOST_MACHINE));
    return -ENOEXEC;
  }
  if (n < (ssize_t)sizeof(h)) {
    snprintf(why, whylen, "a truncated ELF file");
    return -ENOEXEC;
  }
  if (h.e_ident[EI_DATA] !=
      (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB)) {
    snprintf(why, whylen, "an ELF file of the other byte order");
    return -ENOEXEC;
  }
  if (HOST_MACHINE != EM_NONE && h.e_machine != HOST_MACHINE) {
    m = machine_name(h.e_machine);
    if (m)
      snprintf(why, whylen, "a shared object for %s; this agent runs on %s", m,
               machine_name(HOST_MACHINE));
    else
      snprintf(why, whylen,
               "a shared object for ELF machine %u; this agent runs on %s",
               h.e_machine, machine_name(HOST_MACHINE));
    return -ENOEXEC;
  }
  if (h.e_type != ET_DYN) {
    snprintf(why, whylen,
             "an ELF %s, not a shared object (build it with "
             "-shared -fPIC)",
             h.e_type == ET_EXEC ? "executable" : "object of another kind");
    return -ENOEXEC;
  }
  return 0;
}

void lynx_app_refuse(const char *name, const char *reason) {
  struct refusal *r;
  if (reg.n_refused == REFUSED_MAX)
    return;
  r = &reg.refused[reg.n_refused++];
  snprintf(r->name, sizeof(r->name), "%s", name);
  snprintf(r->reason, sizeof(r->reason), "%s", reason);
}

/* "libkv.so" -> "kv": what a refusal is kept under when nothing better is
 * known. */
void lynx_app_file_stem(const char *path, char *out, size_t len) {
  const char *b = strrchr(path, '/');
  size_t n;
  b = b ? b + 1 : path;
  if (!strncmp(b, "lib", 3) && b[3])
    b += 3;
  n = strlen(b);
  if (n > 3 && !strcmp(b + n - 3, ".so"))
    n -= 3;
  snprintf(out, len, "%.*s", (int)n, b);
}

/* 0 when name, the one the operator gave (NULL: none), is an application
 * name, else -EINVAL with why. */
static int name_given_ok(const char *name, char *why, size_t whylen) {
  if (!name || lynx_app_name_ok(name))
    return 0;
  snprintf(why, whylen,
           "'%s' is not an application name (1-%d characters of [a-z0-9._-])",
           name, LYNX_APP_NAME_MAX - 1);
  return -EINVAL;
}

/* 0 when no application is called name, else -EEXIST with who is. */
static int name_free(const char *name, char *why, size_t whylen) {
  const struct lynx_app *other = lynx_app_find(name);
  if (!other)
    return 0;
  if (other->dl || other->host || other->image)
    snprintf(why, whylen,
             "application '%s' is already loaded from %s (names are unique "
             "on an agent)",
             name, other->origin);
  else
    snprintf(why, whylen,
             "'%s' is the name of a built-in application (names are unique "
             "on an agent)",
             name);
  return -EEXIST;
}

/* The definition's own checks, once the entry returned it. */
static int def_check(const struct lynx_app_def *d, const char *want, char *why,
                     size_t whylen) {
  if (!d) {
    snprintf(why, whylen, "its %s returned no definition", LYNX_APP_ENTRY_NAME);
    return -EINVAL;
  }
  if (d->abi_version != LYNX_APP_ABI_VERSION) {
    snprintf(why, whylen,
             "built for plug-in ABI version %u; this agent runs version %u "
             "(rebuild it against this agent's SDK)",
             d->abi_version, LYNX_APP_ABI_VERSION);
    return -EPROTO;
  }
  if (d->size < sizeof(struct lynx_app_def)) {
    snprintf(why, whylen,
             "its definition is %u bytes; ABI version %u has %zu (a header "
             "that does not match its version)",
             d->size, LYNX_APP_ABI_VERSION, sizeof(struct lynx_app_def));
    return -EPROTO;
  }
  if (d->mq_size != sizeof(struct lynx_mq)) {
    snprintf(why, whylen,
             "its struct lynx_mq is %u bytes, this agent's %zu (headers "
             "that do not match its ABI version)",
             d->mq_size, sizeof(struct lynx_mq));
    return -EPROTO;
  }
  if (!lynx_app_name_ok(d->name)) {
    snprintf(why, whylen,
             "its name is not 1-%d characters of [a-z0-9._-] starting with "
             "a letter or digit",
             LYNX_APP_NAME_MAX - 1);
    return -EINVAL;
  }
  if (want && strcmp(want, d->name)) {
    snprintf(why, whylen, "it defines application '%s', not '%s'", d->name,
             want);
    return -EINVAL;
  }
  if (!d->handle) {
    snprintf(why, whylen, "its definition has no handle function");
    return -EINVAL;
  }
  if (d->needs_backend && d->needs_backend[0] &&
      strlen(d->needs_backend) >= LYNX_BACKEND_NAME_MAX) {
    snprintf(why, whylen, "its back end's name is longer than %d characters",
             LYNX_BACKEND_NAME_MAX - 1);
    return -EINVAL;
  }
  return name_free(d->name, why, whylen);
}

int lynx_app_check_file(const char *path, char *why, size_t whylen) {
  /* O_NONBLOCK: a FIFO named *.so does not hold the agent's start */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), rc;
  struct stat st;
  if (fd < 0) {
    rc = -errno;
    snprintf(why, whylen, "cannot open it: %s", strerror(errno));
    return rc;
  }
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    snprintf(why, whylen, "not a regular file");
    return -ENOEXEC;
  }
  rc = elf_check(fd, why, whylen);
  close(fd);
  return rc;
}

int lynx_app_add_hosted(const char *name, const char *help,
                        const char *needs_backend, const char *origin,
                        const struct lynx_accel_ops *runner, void *host,
                        char *why, size_t whylen) {
  struct lynx_app *a;
  char *n = NULL, *h = NULL, *b = NULL, *o = NULL;
  int rc;
  reg_ready();
  rc = name_free(name, why, whylen);
  if (!rc && reg.n_loaded == LOADED_MAX) {
    snprintf(why, whylen, "an agent loads at most %u plug-ins", LOADED_MAX);
    rc = -ENOSPC;
  }
  if (!rc &&
      (!(n = strdup(name)) || !(h = strdup(help ? help : "")) ||
       !(o = strdup(origin)) ||
       (needs_backend && needs_backend[0] && !(b = strdup(needs_backend))))) {
    snprintf(why, whylen, "out of memory");
    rc = -ENOMEM;
  }
  if (rc) {
    free(n);
    free(h);
    free(b);
    free(o);
    lynx_app_refuse(name, why);
    return rc;
  }
  a = &reg.loaded[reg.n_loaded++];
  memset(a, 0, sizeof(*a));
  a->name = n;
  a->help = h;
  a->needs_backend = b;
  a->origin = o;
  a->cuda_app = LYNX_CUDA_APP_NONE;
  a->runner = runner;
  a->host = host;
  return 0;
}

int lynx_app_load(const char *name, const char *path, char *why,
                  size_t whylen) {
  char reason[300], stem[LYNX_APP_NAME_MAX];
  const struct lynx_app_def *d = NULL;
  lynx_app_entry_fn entry;
  struct lynx_app *a;
  void *dl = NULL;
  int rc;
  reg_ready();
  lynx_app_file_stem(path, stem, sizeof(stem));
  rc = name_given_ok(name, reason, sizeof(reason));
  if (rc)
    goto refused;
  if (reg.n_loaded == LOADED_MAX) {
    snprintf(reason, sizeof(reason), "an agent loads at most %u plug-ins",
             LOADED_MAX);
    rc = -ENOSPC;
    goto refused;
  }
  rc = lynx_app_check_file(path, reason, sizeof(reason));
  if (rc)
    goto refused;
  /* RTLD_NOW: a symbol it lacks is said here, not at its first request;
   * RTLD_LOCAL: its symbols stay its own */
  dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char *e = dlerror();
    snprintf(reason, sizeof(reason), "cannot load it: %s", e ? e : "?");
    rc = -ENOEXEC;
    goto refused;
  }
  *(void **)&entry = dlsym(dl, LYNX_APP_ENTRY_NAME);
  if (!entry) {
    snprintf(reason, sizeof(reason),
             "no %s: not a Lynx plug-in (it defines its application with "
             "LYNX_APP_EXPORT, lynx_app.h)",
             LYNX_APP_ENTRY_NAME);
    rc = -ENOENT;
    goto refused;
  }
  d = entry();
  rc = def_check(d, name, reason, sizeof(reason));
  if (rc)
    goto refused;
  a = &reg.loaded[reg.n_loaded++];
  memset(a, 0, sizeof(*a));
  from_def(a, d);
  a->cuda_app = LYNX_CUDA_APP_NONE;
  a->origin = strdup(path);
  a->dl = dl;
  if (!a->origin) {
    reg.n_loaded--;
    snprintf(reason, sizeof(reason), "out of memory");
    rc = -ENOMEM;
    goto refused;
  }
  LYNX_INFO("apps", "application '%s' loaded from %s", a->name, path);
  return 0;
refused:
  /* the name a service would use: the operator's, the definition's, or
   * the file's */
  lynx_app_refuse(
      name ? name
      : d && d->size >= offsetof(struct lynx_app_def, name) + sizeof(d->name) &&
              lynx_app_name_ok(d->name)
          ? d->name /* where it is in every version (lynx_app.h) */
          : stem,
      reason);
  snprintf(why, whylen, "%s: %s", path, reason);
  if (dl)
    dlclose(dl);
  return rc;
}

/* ---- GPU applications (CUDA modules) ------------------------------------ */

#define FATBIN_MAGIC 0xBA55ED50u
#define MODULE_MAX (256u << 20) /* the largest module file read */

int lynx_app_is_fatbin(const char *path) {
  uint32_t magic = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  ssize_t n;
  if (fd < 0)
    return 0;
  n = pread(fd, &magic, sizeof(magic), 0);
  close(fd);
  return n == (ssize_t)sizeof(magic) && magic == FATBIN_MAGIC;
}

static uint64_t le_get(const uint8_t *p, unsigned bytes) {
  uint64_t v = 0;
  for (unsigned i = bytes; i-- > 0;)
    v = v << 8 | p[i];
  return v;
}

/*
 * The container of a fatbin (what nvcc -fatbin writes): a 16-byte header
 * (magic, version, header size, the entries' bytes) and its entries, each
 * a header (kind: 1 PTX, 2 a cubin; its header size; its payload's size;
 * at byte 28 the architecture, 90 for sm_90) and its payload. Calls fn for
 * each entry's kind and architecture: 0, or -ENOEXEC with what is wrong.
 * The driver checks the code itself at load.
 */
typedef void (*fatbin_entry_fn)(void *arg, unsigned kind, unsigned arch);

static int fatbin_walk(const uint8_t *b, size_t len, fatbin_entry_fn fn,
                       void *arg, char *why, size_t whylen) {
  uint64_t hs, fat, off, end;
  unsigned entries = 0;
  if (len < 16 || le_get(b, 4) != FATBIN_MAGIC) {
    snprintf(why, whylen, "not a CUDA fatbin");
    return -ENOEXEC;
  }
  hs = le_get(b + 6, 2);
  fat = le_get(b + 8, 8);
  if (hs < 16 || hs > len || fat > len - hs) {
    snprintf(why, whylen,
             "a truncated CUDA fatbin (%zu bytes; its header says %llu)", len,
             (unsigned long long)(hs + fat));
    return -ENOEXEC;
  }
  end = hs + fat;
  for (off = hs; off < end;) {
    uint64_t ehs, size;
    if (end - off < 32) {
      snprintf(why, whylen, "a CUDA fatbin with a truncated entry");
      return -ENOEXEC;
    }
    ehs = le_get(b + off + 4, 4);
    size = le_get(b + off + 8, 8);
    if (ehs < 32 || ehs > end - off || size > end - off - ehs) {
      snprintf(why, whylen, "a CUDA fatbin with a truncated entry");
      return -ENOEXEC;
    }
    fn(arg, (unsigned)le_get(b + off, 2), (unsigned)le_get(b + off + 28, 4));
    entries++;
    off += ehs + size;
  }
  if (!entries) {
    snprintf(why, whylen, "a CUDA fatbin without code");
    return -ENOEXEC;
  }
  return 0;
}

/* The code a fatbin carries, as its refusals name it ("sm_80, sm_90,
 * compute_90 (PTX)"). */
struct code_text {
  char *s;
  size_t cap, len;
};

static void code_text_add(void *arg, unsigned kind, unsigned arch) {
  struct code_text *t = arg;
  if (kind == 1 || kind == 2)
    t->len = lynx_appendf(t->s, t->cap, t->len, ", ",
                          kind == 2 ? "sm_%u" : "compute_%u (PTX)", arch);
}

/* Whether a fatbin has code for compute capability cc: a cubin for it, or
 * PTX of one at most its own, which the driver compiles. */
struct code_for {
  unsigned cc;
  int yes;
};

static void code_for_entry(void *arg, unsigned kind, unsigned arch) {
  struct code_for *c = arg;
  c->yes |= (kind == 2 && arch == c->cc) || (kind == 1 && arch <= c->cc);
}

int lynx_app_image_runs_on(const struct lynx_app *app, unsigned cc) {
  struct code_for c = {cc, 0};
  char why[96];
  return app->image &&
         fatbin_walk(app->image, app->image_len, code_for_entry, &c, why,
                     sizeof(why)) == 0 &&
         c.yes;
}

int lynx_app_load_module(const char *name, const char *path, char *why,
                         size_t whylen) {
  char reason[300], stem[LYNX_APP_NAME_MAX], *dot;
  uint8_t *img = NULL;
  struct lynx_app *a;
  struct stat st;
  size_t got = 0;
  int fd = -1, rc;
  reg_ready();
  lynx_app_file_stem(path, stem, sizeof(stem));
  if ((dot = strrchr(stem, '.')) && !strcmp(dot, ".fatbin"))
    *dot = 0;
  rc = name_given_ok(name, reason, sizeof(reason));
  if (rc)
    goto refused;
  rc = name_free(name ? name : stem, reason, sizeof(reason));
  if (!rc && reg.n_loaded == LOADED_MAX) {
    snprintf(reason, sizeof(reason), "an agent loads at most %u plug-ins",
             LOADED_MAX);
    rc = -ENOSPC;
  }
  if (rc)
    goto refused;
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 || fstat(fd, &st)) {
    rc = -errno;
    snprintf(reason, sizeof(reason), "cannot open it: %s", strerror(errno));
    goto refused;
  }
  if (!S_ISREG(st.st_mode) || st.st_size > (off_t)MODULE_MAX) {
    rc = -ENOEXEC;
    snprintf(reason, sizeof(reason), "%s",
             !S_ISREG(st.st_mode) ? "not a regular file"
                                  : "a CUDA module larger than 256 MiB");
    goto refused;
  }
  img = malloc((size_t)st.st_size + 1);
  while (img && got < (size_t)st.st_size) {
    ssize_t n = pread(fd, img + got, (size_t)st.st_size - got, (off_t)got);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  if (!img || got != (size_t)st.st_size) {
    snprintf(reason, sizeof(reason), "%s",
             img ? "cannot read it" : "out of memory");
    rc = img ? -EIO : -ENOMEM;
    goto refused;
  }
  a = &reg.loaded[reg.n_loaded];
  memset(a, 0, sizeof(*a));
  {
    struct code_text t = {a->image_code, sizeof(a->image_code), 0};
    rc = fatbin_walk(img, got, code_text_add, &t, reason, sizeof(reason));
  }
  if (rc)
    goto refused;
  a->name = strdup(name ? name : stem);
  a->origin = strdup(path);
  a->help = strdup("");
  if (!a->name || !a->origin || !a->help) {
    free((char *)a->name);
    free((char *)a->origin);
    free((char *)a->help);
    snprintf(reason, sizeof(reason), "out of memory");
    rc = -ENOMEM;
    goto refused;
  }
  a->cuda_app = LYNX_CUDA_APP_NONE;
  a->image_named = name != NULL;
  a->image = img;
  a->image_len = got;
  reg.n_loaded++;
  close(fd);
  LYNX_INFO("apps", "GPU application '%s' read from %s (%s)", a->name, path,
            a->image_code);
  return 0;
refused:
  free(img);
  if (fd >= 0)
    close(fd);
  lynx_app_refuse(name ? name : stem, reason);
  snprintf(why, whylen, "%s: %s", path, reason);
  return rc;
}

struct lynx_app *lynx_app_module_at(size_t i) {
  reg_ready();
  for (size_t k = 0; k < reg.n_loaded; k++)
    if (reg.loaded[k].image && !reg.loaded[k].module && i-- == 0)
      return &reg.loaded[k];
  return NULL;
}

int lynx_app_adopt(struct lynx_app *app, void *module, const char *name,
                   const char *help, const char *needs_backend, char *why,
                   size_t whylen) {
  char *n = NULL, *h = NULL, *b = NULL;
  if (!lynx_app_name_ok(name)) {
    snprintf(why, whylen,
             "its module names its application '%.40s', which is not an "
             "application name (1-%d characters of [a-z0-9._-])",
             name, LYNX_APP_NAME_MAX - 1);
    return -EINVAL;
  }
  if (strcmp(name, app->name)) {
    int rc;
    if (app->image_named) {
      snprintf(why, whylen, "its module's application is '%s', not '%s'", name,
               app->name);
      return -EINVAL;
    }
    rc = name_free(name, why, whylen);
    if (rc)
      return rc;
  }
  if (!(n = strdup(name)) || !(h = strdup(help ? help : "")) ||
      (needs_backend && needs_backend[0] && !(b = strdup(needs_backend)))) {
    free(n);
    free(h);
    snprintf(why, whylen, "out of memory");
    return -ENOMEM;
  }
  free((char *)app->name);
  free((char *)app->help);
  app->name = n;
  app->help = h;
  app->needs_backend = b;
  app->module = module;
  return 0;
}

/* What a loaded application holds: a plug-in's library, or a hosted
 * plug-in's or a module's own strings and image. */
static void app_release(struct lynx_app *a) {
  free(a->default_config);
  free((char *)a->origin);
  free((void *)a->image);
  if (a->dl)
    dlclose(a->dl);
  else { /* hosted, or a module: the strings are its own */
    free((char *)a->name);
    free((char *)a->help);
    free((char *)a->needs_backend);
  }
}

void lynx_app_drop(struct lynx_app *app, const char *reason) {
  size_t i = (size_t)(app - reg.loaded);
  if (i >= reg.n_loaded)
    return;
  lynx_app_refuse(app->name, reason);
  LYNX_ERR("apps", "GPU application '%s' (%s) refused: %s", app->name,
           app->origin, reason);
  app_release(app);
  memmove(&reg.loaded[i], &reg.loaded[i + 1],
          (reg.n_loaded - i - 1) * sizeof(reg.loaded[0]));
  reg.n_loaded--;
}

/* A plug-in's file: a shared object (*.so) or a CUDA module (*.fatbin). */
static int so_name(const struct dirent *e) {
  size_t n = strlen(e->d_name);
  return e->d_name[0] != '.' &&
         ((n > 3 && !strcmp(e->d_name + n - 3, ".so")) ||
          (n > 7 && !strcmp(e->d_name + n - 7, ".fatbin")));
}

static int load_here(void *arg, const char *name, const char *path, char *why,
                     size_t whylen) {
  (void)arg;
  if (lynx_app_is_fatbin(path))
    return lynx_app_load_module(name, path, why, whylen);
  return lynx_app_load(name, path, why, whylen);
}

int lynx_app_load_dir(const char *dir, lynx_app_loader load, void *arg,
                      char *why, size_t whylen) {
  struct dirent **list = NULL;
  int n = scandir(dir, &list, so_name, alphasort), loaded = 0;
  if (n < 0) {
    snprintf(why, whylen, "--app-dir %s: %s", dir, strerror(errno));
    return -errno;
  }
  for (int i = 0; i < n; i++) {
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s/%s", dir, list[i]->d_name);
    if ((load ? load : load_here)(arg, NULL, path, err, sizeof(err)) == 0)
      loaded++;
    else
      LYNX_ERR("apps", "plug-in refused: %s", err);
    free(list[i]);
  }
  free(list);
  return loaded;
}

int lynx_app_refused_at(size_t i, const char **name, const char **reason) {
  if (i >= reg.n_refused)
    return 0;
  *name = reg.refused[i].name;
  *reason = reg.refused[i].reason;
  return 1;
}

const char *lynx_app_refusal(const char *name) {
  for (size_t i = 0; i < reg.n_refused; i++)
    if (!strcmp(reg.refused[i].name, name))
      return reg.refused[i].reason;
  return NULL;
}

int lynx_app_set_default(const char *name, const char *config, char *why,
                         size_t whylen) {
  struct lynx_app *a = (struct lynx_app *)lynx_app_find(name);
  struct json_object *o;
  size_t n = strlen(config);
  char *copy;
  if (!a) {
    snprintf(why, whylen, "no application '%s'", name);
    return -ENOENT;
  }
  if (n >= LYNX_APP_CONFIG_MAX) {
    snprintf(why, whylen, "%s: its configuration is %zu bytes (at most %d)",
             name, n, LYNX_APP_CONFIG_MAX - 1);
    return -EINVAL;
  }
  o = json_tokener_parse(config);
  if (!o || !json_object_is_type(o, json_type_object)) {
    json_object_put(o);
    snprintf(why, whylen, "%s: its configuration is not a JSON object", name);
    return -EINVAL;
  }
  json_object_put(o);
  copy = strdup(config);
  if (!copy) {
    snprintf(why, whylen, "out of memory");
    return -ENOMEM;
  }
  free(a->default_config);
  a->default_config = copy;
  return 0;
}

void lynx_apps_unload(void) {
  reg_ready();
  for (size_t i = 0; i < reg.n_builtin; i++) {
    free(reg.builtin[i].default_config);
    reg.builtin[i].default_config = NULL;
  }
  for (size_t i = 0; i < reg.n_loaded; i++)
    app_release(&reg.loaded[i]);
  reg.n_loaded = 0;
  reg.n_refused = 0;
}

/* ---- an instance's application --------------------------------------- */

static int env_call(const struct lynx_app_ctx *ctx, const char *backend,
                    const void *req, uint32_t len, uint8_t *reply, uint32_t cap,
                    uint32_t *reply_len) {
  const struct lynx_app_env *e = ctx->host_priv;
  for (uint32_t i = 0; backend && i < e->n_clients; i++)
    if (!strcmp(e->clients[i].name, backend))
      return lynx_call(&e->clients[i], req, len, reply, cap, reply_len,
                       ctx->call_timeout_ns);
  return -ENOENT;
}

static void env_log(const struct lynx_app_ctx *ctx, int level,
                    const char *msg) {
  int l = level <= LYNX_APP_LOG_ERR    ? LYNX_LOG_ERROR
          : level == LYNX_APP_LOG_WARN ? LYNX_LOG_WARN
          : level == LYNX_APP_LOG_INFO ? LYNX_LOG_INFO
                                       : LYNX_LOG_DEBUG;
  LYNX_LOG_RL(l, "app", "%s: %s", ctx->app, msg ? msg : "");
}

static const struct lynx_app_host env_host = {
    .size = sizeof(struct lynx_app_host), .call = env_call, .log = env_log};

void lynx_app_env_init(struct lynx_app_env *e, const struct lynx_app *app,
                       struct lynx_client *clients, uint32_t n_clients,
                       void *state, const volatile int *stop,
                       uint64_t call_timeout_ns) {
  memset(e, 0, sizeof(*e));
  e->ctx.size = sizeof(e->ctx);
  e->clients = clients;
  e->n_clients = n_clients;
  e->ctx.state = state;
  e->ctx.stop = stop;
  e->ctx.call_timeout_ns = call_timeout_ns;
  e->ctx.host = &env_host;
  e->ctx.host_priv = e;
  e->ctx.app = app ? app->name : "";
}

int lynx_app_start(const struct lynx_app *app, const char *service,
                   const char *config, uint32_t n_mqueues,
                   uint32_t slot_payload, uint32_t msg_max,
                   const char *const *backends, uint32_t n_backends,
                   void **state, char *why, size_t whylen) {
  struct lynx_app_start st = {.size = sizeof(st),
                              .service = service,
                              .n_mqueues = n_mqueues,
                              .slot_payload = slot_payload,
                              .msg_max = msg_max,
                              .n_backends = n_backends,
                              .backends = backends};
  char err[320] = "";
  int rc;
  *state = NULL;
  if (!app->def || !app->def->start) /* hosted: its process starts it */
    return 0;
  st.config = config && config[0]   ? config
              : app->default_config ? app->default_config
                                    : "{}";
  st.config_len = (uint32_t)strlen(st.config);
  rc = app->def->start(&st, state, err, sizeof(err));
  if (rc) {
    *state = NULL;
    snprintf(why, whylen, "%s: %s", app->name,
             err[0] ? err : strerror(rc < 0 ? -rc : EINVAL));
    return rc < 0 ? rc : -EINVAL;
  }
  return 0;
}

void lynx_app_stop(const struct lynx_app *app, void *state) {
  if (app->def && app->def->stop)
    app->def->stop(state);
}
