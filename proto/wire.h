/*
 * wire.h - the limits of what the control protocol (lynx.proto) carries,
 * shared by every program that builds or reads its messages: the
 * coordinator's registry, the agent and the frontend size their buffers
 * with these, and the registry refuses a message that exceeds one. Also
 * the "k=v,k2=v2" label syntax of --labels and the API.
 */
#ifndef LYNX_PROTO_WIRE_H
#define LYNX_PROTO_WIRE_H

#include <stdint.h>

#define LYNX_ID_MAX 64     /* node, service and frontend ids, with NUL */
#define LYNX_LABELS_MAX 16 /* labels one node carries */
#define LYNX_LABEL_MAX 64  /* a label's key or value, with NUL */
#define LYNX_ACCELS_MAX 64 /* accelerators one agent registers */
#define LYNX_APPS_MAX 64   /* applications one accelerator advertises */
#define LYNX_APP_NAME_MAX                                                      \
  32                           /* an application's name, with NUL (lynx_app.h) \
                                */
#define LYNX_PCI_ID_MAX 32     /* a GPU's PCI bus id, with NUL */
#define LYNX_ACCEL_ERR_MAX 128 /* an accelerator's last error */
#define LYNX_REFUSED_APPS_MAX 16 /* refused plug-ins one agent registers */
#define LYNX_APP_FAULTS_MAX 16   /* plug-ins' deaths one heartbeat reports */
#define LYNX_APP_REFUSAL_MAX 320 /* the reason, with NUL */
#define LYNX_APP_CONFIG_MAX                                                    \
  4096                      /* a service's app configuration (lynx_app.h) */
#define LYNX_BACKENDS_MAX 8 /* back ends (client mqueues) of one service */
#define LYNX_BACKEND_NAME_MAX 32
#define LYNX_ADDR_MAX 64 /* a "host:port", with NUL */

struct lynx_label {
  char key[LYNX_LABEL_MAX];
  char value[LYNX_LABEL_MAX];
};

/* Parses "k=v,k2=v2" into at most max labels. 0, or -EINVAL on a
 * malformed pair, a key given twice or too many. */
int lynx_labels_parse(const char *s, struct lynx_label *out, uint32_t max,
                      uint32_t *n);

#endif
