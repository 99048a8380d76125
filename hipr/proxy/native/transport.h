/* Sockets for the proxy: tcp://HOST:PORT and unix:///PATH (tls:// and ssh:// are not
 * served yet). Blocking I/O; EINTR retried. */
#ifndef HIPR_TRANSPORT_H
#define HIPR_TRANSPORT_H

#include <stddef.h>

/* A connected socket, or -1 with a message in err. */
int hipr_transport_connect(const char *url, double timeout_s, char *err, size_t err_size);
/* 0 once all bytes are written, -1 on failure. */
int hipr_transport_send_all(int fd, const void *data, size_t n);
/* Bytes read (> 0), 0 at end of stream, -1 on failure. */
long hipr_transport_recv(int fd, void *buf, size_t n);
/* 1 when readable within timeout_ms (0: poll only), 0 when not, -1 on failure. */
int hipr_transport_wait_readable(int fd, int timeout_ms);

#endif
