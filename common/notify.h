/*
 * notify.h - readiness and status for the service manager (systemd's
 * Type=notify units, deploy/systemd/): libsystemd's sd_notify. Without
 * $NOTIFY_SOCKET (not started by systemd) every call does nothing.
 *
 * Each daemon says READY=1 once it serves: the coordinator when its
 * control port and API listen, an agent when it registered with the
 * coordinator (or, static, when it serves its descriptors), a frontend
 * when it applied its first table (or, static, serves its port); then
 * STOPPING=1 when it starts shutting down. STATUS= lines say what it does
 * meanwhile (`systemctl status` shows the last).
 */
#ifndef LYNX_NOTIFY_H
#define LYNX_NOTIFY_H

/* READY=1 with a STATUS= line (printf format); only the first call of
 * the process sends READY=1, later ones the status alone. */
void lynx_notify_ready(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
/* STOPPING=1 with a STATUS= line. */
void lynx_notify_stopping(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

#endif
