/* The proxy's link to the worker: tcp://HOST:PORT, unix:///PATH, tls://HOST[:PORT]
 * (OpenSSL, the server certificate verified) and ssh://[USER@]HOST[:PORT]/SOCKET or
 * ssh://HOST?target=H:P (the system's OpenSSH client forwarding a private Unix socket,
 * as hipr/transports/ssh.py does). Blocking I/O, EINTR retried, no SIGPIPE. */
#ifndef HIPR_TRANSPORT_H
#define HIPR_TRANSPORT_H

#include <stddef.h>
#include <sys/uio.h>

typedef struct hipr_link hipr_link;

/* A connected link, or NULL with a message in err. `timeout_s` bounds the connect and
 * any handshake (ssh's authentication gets 20 s more, as the Python transport gives). */
hipr_link *hipr_link_open(const char *url, double timeout_s, char *err, size_t err_size);
/* Closes the link (TLS close_notify is not waited for; an ssh process is ended and
 * reaped). NULL is ignored. */
void hipr_link_close(hipr_link *link);
/* In a forked child: frees the parent's link without touching the parent's connection
 * (no TLS shutdown, its ssh left running). */
void hipr_link_forget(hipr_link *link);

/* 0 once every byte of the buffers is written, -1 on failure. */
int hipr_link_send(hipr_link *link, const struct iovec *iov, int iovcnt);
/* Bytes read (> 0), 0 at end of stream, -1 on failure. Blocks until some arrive. */
long hipr_link_recv(hipr_link *link, void *buf, size_t n);
/* As hipr_link_recv, but -2 at once when nothing has arrived (the caller spins). */
long hipr_link_recv_nowait(hipr_link *link, void *buf, size_t n);
/* 1 when readable within timeout_ms (0: poll only; -1: no limit), 0 when not, -1 on
 * failure. Bytes TLS has decrypted but not yet handed out count as readable. */
int hipr_link_wait_readable(hipr_link *link, int timeout_ms);
/* As hipr_link_wait_readable, but 2 as soon as `wake_fd` is readable (and the link not):
 * a thread that watches a link can be woken. */
int hipr_link_wait_readable_or(hipr_link *l, int wake_fd, int timeout_ms);
/* As hipr_link_wait_readable for at most `seconds` (sub-millisecond: poll's milliseconds
 * would oversleep a forecast wait); an interrupted nap returns 0 early. */
int hipr_link_nap(hipr_link *link, double seconds);
/* A send that makes no progress for `seconds` fails (a route that stopped moving is
 * taken for dead, as a silent read is); 0: no limit. */
void hipr_link_set_send_timeout(hipr_link *link, double seconds);
/* Why the link failed, where the transport knows more than errno (ssh's stderr, the
 * TLS alert); "" otherwise. */
const char *hipr_link_failure(hipr_link *link);
/* "tcp", "unix", "tls" or "ssh". */
const char *hipr_link_kind(const hipr_link *link);

/* Used by the link and by tests of URL handling: the value of `key` in the URL's query
 * (percent-decoded into buf; the n-th occurrence, from 0), or NULL when absent. */
const char *hipr_url_query(const char *url, const char *key, int nth, char *buf, size_t size);

/* In a forked child (from the atfork handler): the ssh spawner thread is the
 * parent's. */
void hipr_transport_after_fork_child(void);

#endif
