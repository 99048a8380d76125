/* See transport.h. tcp and unix are plain sockets; tls wraps a tcp socket in OpenSSL;
 * ssh starts `ssh -N -L <private socket>:<target>` exactly as hipr/transports/ssh.py
 * does (same options, same private 0700 directory, the socket removed once connected)
 * and connects to the forward. */
#define _GNU_SOURCE
#include "transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "quiet_thread.h"

#define DEFAULT_TCP_PORT 18515
#define DEFAULT_TLS_PORT 18516
/* As hipr/transports/unix.py's size_send_buffer: a large copy moves in fewer, larger
 * writes (the default ~200 KiB costs a context switch per few hundred KiB). */
#define UNIX_SEND_BUFFER (1 << 20)
#define SSH_STDERR_TAIL 4096
#define SSH_TERMINATE_GRACE_MS 2000

enum kind { K_TCP, K_UNIX, K_TLS, K_SSH };
static const char *const KIND_NAMES[] = {"tcp", "unix", "tls", "ssh"};

struct hipr_link {
    int fd;
    enum kind kind;
    SSL_CTX *ctx;
    SSL *ssl;
    pid_t ssh_pid;
    int ssh_err_fd;
    off_t ssh_err_mark; /* what ssh printed while connecting is not news */
    int received;       /* anything came from the worker on this link */
    char failure[600];
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* --- URLs ------------------------------------------------------------------------------ */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decodes [s, s+n) into buf (as urllib's unquote/parse_qsl: '+' is a space in
 * a query). */
static void decode(const char *s, size_t n, int plus, char *buf, size_t size) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < size; i++) {
        if (s[i] == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
            buf[o++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
            i += 2;
        } else {
            buf[o++] = plus && s[i] == '+' ? ' ' : s[i];
        }
    }
    buf[o] = '\0';
}

const char *hipr_url_query(const char *url, const char *key, int nth, char *buf, size_t size) {
    const char *q = strchr(url, '?');
    if (!q) return NULL;
    size_t klen = strlen(key);
    for (const char *p = q + 1; *p;) {
        const char *end = p + strcspn(p, "&");
        const char *eq = memchr(p, '=', (size_t)(end - p));
        const char *kend = eq ? eq : end;
        char name[64];
        decode(p, (size_t)(kend - p), 1, name, sizeof name);
        if (strlen(name) == klen && memcmp(name, key, klen) == 0 && nth-- == 0) {
            if (eq) decode(eq + 1, (size_t)(end - eq - 1), 1, buf, size);
            else if (size) buf[0] = '\0';
            return buf;
        }
        p = *end ? end + 1 : end;
    }
    return NULL;
}

typedef struct parsed_url {
    char user[128];
    char host[256];
    int port; /* -1: none given */
    char path[512];
} parsed_url;

/* scheme://[user@]host[:port][/path][?query]; 0, or -1 with a message. */
static int parse_url(const char *url, parsed_url *u, char *err, size_t err_size) {
    memset(u, 0, sizeof *u);
    u->port = -1;
    const char *p = strstr(url, "://");
    if (!p) {
        snprintf(err, err_size, "bad worker URL %s", url);
        return -1;
    }
    p += 3;
    size_t alen = strcspn(p, "/?");
    const char *auth_end = p + alen;
    const char *at = memchr(p, '@', alen);
    if (at) {
        decode(p, (size_t)(at - p), 0, u->user, sizeof u->user);
        p = at + 1;
    }
    const char *host_end;
    if (*p == '[') {
        const char *close = memchr(p, ']', (size_t)(auth_end - p));
        if (!close) {
            snprintf(err, err_size, "bad IPv6 address in %s", url);
            return -1;
        }
        decode(p + 1, (size_t)(close - p - 1), 0, u->host, sizeof u->host);
        host_end = close + 1;
    } else {
        host_end = memchr(p, ':', (size_t)(auth_end - p));
        if (!host_end) host_end = auth_end;
        decode(p, (size_t)(host_end - p), 0, u->host, sizeof u->host);
    }
    if (host_end < auth_end) {
        if (*host_end != ':' || host_end + 1 == auth_end) {
            snprintf(err, err_size, "bad host:port in %s", url);
            return -1;
        }
        char *e;
        long port = strtol(host_end + 1, &e, 10);
        if (e != auth_end || port <= 0 || port > 65535) {
            snprintf(err, err_size, "bad port in %s", url);
            return -1;
        }
        u->port = (int)port;
    }
    if (*auth_end == '/') decode(auth_end, strcspn(auth_end, "?"), 0, u->path, sizeof u->path);
    return 0;
}

/* host:port as hipr prints it ([::1]:18515 for IPv6). */
static void host_port(char *buf, size_t size, const char *host, int port) {
    if (strchr(host, ':')) snprintf(buf, size, "[%s]:%d", host, port);
    else snprintf(buf, size, "%s:%d", host, port);
}

/* --- plain sockets ----------------------------------------------------------------------- */

/* HIPR_SOCKET_BUFFER: the send buffer to ask for (bytes); else `fallback` (0: the
 * kernel's own, which for TCP keeps its autotuning). */
static int socket_buffer(int fallback) {
    const char *v = getenv("HIPR_SOCKET_BUFFER");
    long n = v && *v ? atol(v) : 0;
    return n > 0 && n <= (1L << 30) ? (int)n : fallback;
}

static int connect_timeout(int fd, const struct sockaddr *addr, socklen_t len, double timeout_s) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return -1;
    int rc = connect(fd, addr, len);
    if (rc < 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int ms = (int)(timeout_s * 1000);
        do rc = poll(&p, 1, ms);
        while (rc < 0 && errno == EINTR);
        if (rc == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (rc < 0) return -1;
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) return -1;
        if (soerr) {
            errno = soerr;
            return -1;
        }
        rc = 0;
    }
    if (rc < 0) return -1;
    return fcntl(fd, F_SETFL, flags);
}

static int connect_unix(const char *path, double timeout_s, char *err, size_t err_size) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path) {
        snprintf(err, err_size, "unix socket path too long: %s", path);
        return -1;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect_timeout(fd, (struct sockaddr *)&addr, sizeof addr, timeout_s) < 0) {
        snprintf(err, err_size, "cannot connect to unix://%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    int size = socket_buffer(UNIX_SEND_BUFFER);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    return fd;
}

static int connect_tcp(const char *host, int port, const char *scheme, double timeout_s, char *err,
                       size_t err_size) {
    char service[16], where[300];
    snprintf(service, sizeof service, "%d", port);
    host_port(where, sizeof where, host, port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai) {
        snprintf(err, err_size, "cannot resolve %s: %s", where, gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    int saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (connect_timeout(fd, ai->ai_addr, ai->ai_addrlen, timeout_s) == 0) break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, err_size, "cannot connect to %s://%s: %s", scheme, where,
                 strerror(saved ? saved : errno));
        return -1;
    }
    /* Small requests go at once; large ones are whole writes anyway. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int size = socket_buffer(0);
    if (size) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    return fd;
}

static hipr_link *new_link(int fd, enum kind kind) {
    hipr_link *l = calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return NULL;
    }
    l->fd = fd;
    l->kind = kind;
    l->ssh_pid = -1;
    l->ssh_err_fd = -1;
    return l;
}

/* --- TLS ------------------------------------------------------------------------------- */

/* OpenSSL writes with write(2): a peer gone would raise SIGPIPE in the program. The
 * signal is blocked around TLS writes and a pending one taken back. */
typedef struct {
    sigset_t old;
    int pending_before;
} pipe_guard;

static void pipe_block(pipe_guard *g) {
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    g->pending_before = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &g->old);
}

static void pipe_unblock(pipe_guard *g) {
    if (!g->pending_before) {
        sigset_t pipe, pending;
        sigemptyset(&pipe);
        sigaddset(&pipe, SIGPIPE);
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE)) {
            struct timespec zero = {0, 0};
            int saved = errno;
            sigtimedwait(&pipe, NULL, &zero);
            errno = saved;
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static int is_pem(const char *s) { return strstr(s, "-----BEGIN ") != NULL; }

/* A setting: the URL's query first, then the environment variable. */
static const char *setting(const char *url, const char *key, const char *env, char *buf,
                           size_t size) {
    const char *v = hipr_url_query(url, key, 0, buf, size);
    if (v && *v) return v;
    v = getenv(env);
    return v && *v ? v : NULL;
}

static void ssl_reason(char *buf, size_t size) {
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    snprintf(buf, size, "%s", r ? r : "the peer closed the connection during the handshake");
}

/* What the user can do about a failed handshake (the Python client's hints). */
static const char *tls_hint(const char *reason) {
    char low[300];
    size_t i = 0;
    for (; reason[i] && i + 1 < sizeof low; i++)
        low[i] = (char)(reason[i] >= 'A' && reason[i] <= 'Z' ? reason[i] + 32 : reason[i]);
    low[i] = '\0';
    if (strstr(low, "hostname mismatch") || strstr(low, "ip address mismatch"))
        return " (connect with the name the certificate was issued for, or set "
               "server_hostname= / HIPR_TLS_SERVER_HOSTNAME)";
    if (strstr(low, "expired") || strstr(low, "not yet valid"))
        return " (the worker's certificate must be renewed, or a clock is wrong)";
    if (strstr(low, "unable to get local issuer") || strstr(low, "self-signed") ||
        strstr(low, "self signed"))
        return " (pass ca= or set HIPR_TLS_CA to the CA that issued the worker's certificate)";
    if (strstr(low, "wrong version number") || strstr(low, "record layer failure") ||
        strstr(low, "packet length") || strstr(low, "unexpected message"))
        return " (is the worker listening with TLS there? a tcp:// worker does not speak TLS)";
    if (strstr(low, "certificate required") || strstr(low, "handshake failure"))
        return " (the worker may require a client certificate: set HIPR_TLS_CERT and "
               "HIPR_TLS_KEY)";
    if (strstr(low, "unknown ca") || strstr(low, "bad certificate"))
        return " (the worker did not accept the client certificate)";
    if (strstr(low, "closed the connection"))
        return " (is the worker listening with TLS there, and does it accept this client?)";
    return "";
}

static int load_ca(SSL_CTX *ctx, const char *ca, char *err, size_t err_size) {
    if (!is_pem(ca)) {
        if (SSL_CTX_load_verify_locations(ctx, ca, NULL) == 1) return 0;
        char r[200];
        ssl_reason(r, sizeof r);
        snprintf(err, err_size, "cannot load the CA %.200s: %s", ca, r);
        return -1;
    }
    BIO *bio = BIO_new_mem_buf(ca, -1);
    X509_STORE *store = SSL_CTX_get_cert_store(ctx);
    int added = 0;
    X509 *x;
    while (bio && (x = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
        if (X509_STORE_add_cert(store, x) == 1) added++;
        X509_free(x);
    }
    BIO_free(bio);
    ERR_clear_error(); /* the end of the PEM text reads as an error */
    if (added) return 0;
    snprintf(err, err_size, "cannot load the CA: no certificate in the PEM text given");
    return -1;
}

static int load_chain(SSL_CTX *ctx, const char *cert, const char *key, char *err,
                      size_t err_size) {
    int ok;
    if (is_pem(cert)) {
        BIO *bio = BIO_new_mem_buf(cert, -1);
        X509 *x = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
        ok = x && SSL_CTX_use_certificate(ctx, x) == 1;
        X509_free(x);
        BIO_free(bio);
    } else {
        ok = SSL_CTX_use_certificate_chain_file(ctx, cert) == 1;
    }
    const char *k = key ? key : cert;
    if (ok) {
        if (is_pem(k)) {
            BIO *bio = BIO_new_mem_buf(k, -1);
            EVP_PKEY *pk = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
            ok = pk && SSL_CTX_use_PrivateKey(ctx, pk) == 1;
            EVP_PKEY_free(pk);
            BIO_free(bio);
        } else {
            ok = SSL_CTX_use_PrivateKey_file(ctx, k, SSL_FILETYPE_PEM) == 1;
        }
    }
    if (ok) ok = SSL_CTX_check_private_key(ctx) == 1;
    if (ok) return 0;
    char r[200];
    ssl_reason(r, sizeof r);
    snprintf(err, err_size, "cannot load the client certificate %.80s: %s",
             is_pem(cert) ? "(PEM text)" : cert, r);
    return -1;
}

static void set_io_timeout(int fd, double seconds) {
    struct timeval tv = {0, 0};
    if (seconds > 0) {
        tv.tv_sec = (time_t)seconds;
        tv.tv_usec = (suseconds_t)((seconds - (double)tv.tv_sec) * 1e6);
        if (!tv.tv_sec && !tv.tv_usec) tv.tv_usec = 1000;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static hipr_link *open_tls(const char *url, const parsed_url *u, double timeout_s, char *err,
                           size_t err_size) {
    char target[300], where[320];
    const char *host = u->host[0] ? u->host : "127.0.0.1";
    int port = u->port > 0 ? u->port : DEFAULT_TLS_PORT;
    host_port(target, sizeof target, host, port);
    snprintf(where, sizeof where, "tls://%s", target);
    char ca_buf[4096], cert_buf[4096], key_buf[4096], name_buf[256], ver_buf[16];
    const char *ca = setting(url, "ca", "HIPR_TLS_CA", ca_buf, sizeof ca_buf);
    const char *cert = setting(url, "cert", "HIPR_TLS_CERT", cert_buf, sizeof cert_buf);
    const char *key = setting(url, "key", "HIPR_TLS_KEY", key_buf, sizeof key_buf);
    const char *name =
        setting(url, "server_hostname", "HIPR_TLS_SERVER_HOSTNAME", name_buf, sizeof name_buf);
    const char *version =
        setting(url, "min_version", "HIPR_TLS_MIN_VERSION", ver_buf, sizeof ver_buf);
    int min_version = TLS1_2_VERSION;
    if (version && strcmp(version, "1.3") == 0) min_version = TLS1_3_VERSION;
    else if (version && strcmp(version, "1.2") != 0) {
        snprintf(err, err_size, "TLS min_version must be one of 1.2, 1.3, not '%s'", version);
        return NULL;
    }
    if (key && !cert) {
        snprintf(err, err_size, "a TLS key (key= / HIPR_TLS_KEY) was given without its cert");
        return NULL;
    }
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, err_size, "cannot create a TLS context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, min_version);
    /* The wire protocol frames its own messages: a peer that hangs up without
     * close_notify is an ordinary end of stream, as in the Python client. */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    /* A given CA replaces the system store: a private CA is the only one that vouches. */
    int bad = ca ? load_ca(ctx, ca, err, err_size) : (SSL_CTX_set_default_verify_paths(ctx) != 1);
    if (!bad && cert) bad = load_chain(ctx, cert, key, err, err_size);
    if (bad) {
        if (!ca || !err[0]) snprintf(err, err_size, "cannot set up TLS for %s", where);
        SSL_CTX_free(ctx);
        return NULL;
    }
    double deadline = now_s() + timeout_s;
    int fd = connect_tcp(host, port, "tls", timeout_s, err, err_size);
    if (fd < 0) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    hipr_link *l = new_link(fd, K_TLS);
    SSL *ssl = l ? SSL_new(ctx) : NULL;
    if (!ssl) {
        snprintf(err, err_size, "out of memory");
        if (l) hipr_link_close(l);
        SSL_CTX_free(ctx);
        return NULL;
    }
    l->ctx = ctx;
    l->ssl = ssl;
    SSL_set_fd(ssl, fd);
    const char *check = name ? name : host;
    unsigned char addr[16];
    int is_ip = inet_pton(AF_INET, check, addr) == 1 || inet_pton(AF_INET6, check, addr) == 1;
    if (is_ip) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), check);
    } else {
        SSL_set_tlsext_host_name(ssl, check);
        SSL_set1_host(ssl, check);
    }
    double left = deadline - now_s();
    set_io_timeout(fd, left > 0.001 ? left : 0.001);
    pipe_guard g;
    pipe_block(&g);
    int rc = SSL_connect(ssl);
    pipe_unblock(&g);
    set_io_timeout(fd, 0);
    if (rc == 1) return l;
    char reason[300];
    long verify = SSL_get_verify_result(ssl);
    int timed_out = SSL_get_error(ssl, rc) == SSL_ERROR_SYSCALL &&
                    (errno == EAGAIN || errno == EWOULDBLOCK);
    if (timed_out) {
        snprintf(err, err_size,
                 "could not connect to %s: the TLS handshake timed out after %g s (is the "
                 "worker listening with TLS there?)",
                 where, timeout_s);
    } else {
        if (verify != X509_V_OK)
            snprintf(reason, sizeof reason, "certificate verify failed: %s",
                     X509_verify_cert_error_string(verify));
        else ssl_reason(reason, sizeof reason);
        snprintf(err, err_size, "TLS handshake with %s failed: %s%s", where, reason,
                 tls_hint(reason));
    }
    hipr_link_close(l);
    return NULL;
}

/* --- ssh --------------------------------------------------------------------------------- */

/* ssh gets PR_SET_PDEATHSIG so that it dies with this process even on SIGKILL; the kernel
 * ties that signal to the thread that forked, so every ssh is forked from one thread
 * that lives as long as the process (the Python transport's spawner thread). */
static pthread_mutex_t sp_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sp_cond = PTHREAD_COND_INITIALIZER;
static int sp_running;
static struct {
    int state; /* 0 idle, 1 asked, 2 done */
    char *const *argv;
    int err_fd;
    pid_t pid;
    int error;
} sp;

static void *spawner(void *arg) {
    (void)arg;
    pid_t parent = getpid();
    pthread_mutex_lock(&sp_lock);
    for (;;) {
        while (sp.state != 1) pthread_cond_wait(&sp_cond, &sp_lock);
        /* A bare fork: fork() would run the program's atfork handlers, the proxy's
         * among them, whose locks the thread asking for this ssh holds. */
        pid_t pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) {
            /* Only async-signal-safe calls from here on. */
            setsid(); /* a Ctrl-C meant for the program leaves the tunnel alone */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            int null = open("/dev/null", O_RDWR);
            if (null >= 0) {
                dup2(null, 0);
                dup2(null, 1);
            }
            dup2(sp.err_fd, 2);
            syscall(SYS_close_range, 3, ~0U, 0);
            execv(sp.argv[0], sp.argv);
            _exit(127);
        }
        sp.pid = pid;
        sp.error = pid < 0 ? errno : 0;
        sp.state = 2;
        pthread_cond_broadcast(&sp_cond);
    }
    return NULL;
}

static pid_t spawn(char *const *argv, int err_fd) {
    pthread_mutex_lock(&sp_lock);
    if (!sp_running) {
        int rc = hipr_start_quiet_thread(spawner);
        if (rc != 0) {
            pthread_mutex_unlock(&sp_lock);
            errno = rc;
            return -1;
        }
        sp_running = 1;
    }
    while (sp.state != 0) pthread_cond_wait(&sp_cond, &sp_lock);
    sp.argv = argv;
    sp.err_fd = err_fd;
    sp.state = 1;
    pthread_cond_broadcast(&sp_cond);
    while (sp.state != 2) pthread_cond_wait(&sp_cond, &sp_lock);
    pid_t pid = sp.pid;
    int error = sp.error;
    sp.state = 0;
    pthread_cond_broadcast(&sp_cond);
    pthread_mutex_unlock(&sp_lock);
    if (pid < 0) errno = error;
    return pid;
}

void hipr_transport_after_fork_child(void) {
    /* The spawner thread is the parent's; the child starts its own when it needs one. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
    sp_lock = fresh;
    sp_cond = fresh_cond;
    sp_running = 0;
    memset(&sp, 0, sizeof sp);
}

/* ssh's stderr from `start` on (its last few KiB), lines stripped, on one line each. */
static void read_tail(int fd, off_t start, char *buf, size_t size) {
    buf[0] = '\0';
    if (fd < 0 || size < 2) return;
    off_t end = lseek(fd, 0, SEEK_END);
    if (end < 0) return;
    off_t from = end - start > SSH_STDERR_TAIL ? end - SSH_STDERR_TAIL : start;
    char raw[SSH_STDERR_TAIL + 1];
    ssize_t n = pread(fd, raw, sizeof raw - 1, from);
    if (n <= 0) return;
    raw[n] = '\0';
    size_t o = 0;
    char *save = NULL;
    for (char *line = strtok_r(raw, "\r\n", &save); line; line = strtok_r(NULL, "\r\n", &save)) {
        while (*line == ' ' || *line == '\t') line++;
        size_t len = strlen(line);
        while (len && (line[len - 1] == ' ' || line[len - 1] == '\t')) line[--len] = '\0';
        if (!len) continue;
        int w = snprintf(buf + o, size - o, "%s%s", o ? "; " : "", line);
        if (w < 0 || (size_t)w >= size - o) break;
        o += (size_t)w;
    }
}

static const char *ssh_hint(const char *message) {
    char low[600];
    size_t i = 0;
    for (; message[i] && i + 1 < sizeof low; i++)
        low[i] = (char)(message[i] >= 'A' && message[i] <= 'Z' ? message[i] + 32 : message[i]);
    low[i] = '\0';
    if (strstr(low, "permission denied"))
        return " (check identity= or your ssh keys/agent, and the remote authorized_keys)";
    if (strstr(low, "host key verification failed"))
        return " (the host key is unknown or changed: connect once with plain `ssh` to check "
               "and record it, or pass known_hosts=)";
    if (strstr(low, "could not resolve hostname")) return " (check the host name)";
    if (strstr(low, "connection refused") && !strstr(low, "open failed"))
        return " (is sshd running there, on that port?)";
    if (strstr(low, "open failed") || strstr(low, "connect failed"))
        return " (is `hipr worker` listening at that target on the remote host?)";
    return "";
}

static void expand_user(const char *path, char *buf, size_t size) {
    const char *home = getenv("HOME");
    if (path[0] == '~' && (path[1] == '/' || !path[1]) && home)
        snprintf(buf, size, "%s%s", home, path + 1);
    else snprintf(buf, size, "%s", path);
}

/* The program's full path on PATH (resolved before fork: execv in the child). */
static int find_program(const char *name, char *buf, size_t size) {
    if (strchr(name, '/')) {
        snprintf(buf, size, "%s", name);
        return access(buf, X_OK);
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(buf, size, "%.*s/%s", (int)n, p, name);
        if (n && access(buf, X_OK) == 0) return 0;
        p += n;
        if (*p) p++;
    }
    return -1;
}

#define MAX_ARGS 96
typedef struct {
    char *argv[MAX_ARGS + 1];
    int n;
    char store[8192];
    size_t used;
} argv_t;

static void arg(argv_t *a, const char *fmt, const char *value) {
    if (a->n >= MAX_ARGS) return;
    int w = snprintf(a->store + a->used, sizeof a->store - a->used, fmt, value);
    if (w < 0 || (size_t)w >= sizeof a->store - a->used) return;
    a->argv[a->n++] = a->store + a->used;
    a->used += (size_t)w + 1;
    a->argv[a->n] = NULL;
}

static int is_socket(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

static void end_ssh(pid_t pid) {
    if (pid <= 0) return;
    if (kill(pid, SIGTERM) < 0) {
        waitpid(pid, NULL, WNOHANG);
        return;
    }
    for (int waited = 0; waited < SSH_TERMINATE_GRACE_MS; waited += 5) {
        pid_t r = waitpid(pid, NULL, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) return;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* A mkdtemp/mkstemp template in $TMPDIR as other programs honour it, or in /tmp where it
 * is unset, relative or too long for the forward's socket path (sun_path: 108 bytes, and
 * the socket is the directory's "/s"). */
static void temp_template(char *out, size_t size, const char *name) {
    const char *base = getenv("TMPDIR");
    if (!base || base[0] != '/' || strlen(base) + strlen(name) + 4 > 100) base = "/tmp";
    size_t end = strlen(base);
    while (end > 1 && base[end - 1] == '/') end--;
    snprintf(out, size, "%.*s/%s", (int)end, base, name);
}

static hipr_link *open_ssh(const char *url, const parsed_url *u, double timeout_s, char *err,
                           size_t err_size) {
    if (!u->host[0]) {
        snprintf(err, err_size, "'%s': an ssh:// URL needs a host, e.g. ssh://me@gpu01/...", url);
        return NULL;
    }
    char q[1024], target[600];
    const char *qt = hipr_url_query(url, "target", 0, q, sizeof q);
    int has_path = u->path[0] && strcmp(u->path, "/") != 0;
    if (has_path && qt) {
        snprintf(err, err_size, "'%s': give the worker's socket path or ?target=host:port, not both",
                 url);
        return NULL;
    }
    if (has_path) {
        snprintf(target, sizeof target, "%s", u->path);
    } else if (qt) {
        const char *colon = strrchr(qt, ':');
        char host[300];
        long port = colon ? strtol(colon + 1, NULL, 10) : 0;
        if (!colon || colon == qt || port <= 0 || port > 65535) {
            snprintf(err, err_size,
                     "ssh target '%s' must be host:port (e.g. 127.0.0.1:18515) or the URL's path "
                     "must be the worker's socket, e.g. ssh://gpu01/run/hipr/worker.sock",
                     qt);
            return NULL;
        }
        snprintf(host, sizeof host, "%.*s", (int)(colon - qt), qt);
        char *h = host;
        size_t hl = strlen(h);
        if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
            h[hl - 1] = '\0';
            h++;
        }
        host_port(target, sizeof target, h, (int)port);
    } else {
        host_port(target, sizeof target, "127.0.0.1", DEFAULT_TCP_PORT);
    }
    double connect_timeout_s = timeout_s;
    if (hipr_url_query(url, "connect_timeout", 0, q, sizeof q) && atof(q) > 0)
        connect_timeout_s = atof(q);
    double total = connect_timeout_s + 20;
    if (hipr_url_query(url, "timeout", 0, q, sizeof q) && atof(q) > 0) total = atof(q);
    char program[512];
    const char *cmd = hipr_url_query(url, "ssh_command", 0, q, sizeof q);
    if (!cmd) cmd = "ssh";
    if (find_program(cmd, program, sizeof program) != 0) {
        snprintf(err, err_size,
                 "ssh transport needs the OpenSSH client: `%.200s` not found on PATH", cmd);
        return NULL;
    }
    char dest[400];
    char hp[300];
    if (u->port > 0) host_port(hp, sizeof hp, u->host, u->port);
    else snprintf(hp, sizeof hp, "%s", u->host);
    snprintf(dest, sizeof dest, "%.90s%s%.290s", u->user, u->user[0] ? "@" : "", hp);

    char dir[128]; /* mode 0700: ours alone */
    temp_template(dir, sizeof dir, "hipr-ssh-XXXXXX");
    if (!mkdtemp(dir)) {
        snprintf(err, err_size, "cannot make a private directory for the ssh forward: %s",
                 strerror(errno));
        return NULL;
    }
    char local[sizeof dir + 2]; /* under 108 bytes used: temp_template keeps dir short */
    snprintf(local, sizeof local, "%s/s", dir);
    argv_t *a = calloc(1, sizeof *a);
    char errpath[128];
    temp_template(errpath, sizeof errpath, "hipr-ssh-err-XXXXXX");
    int err_fd = mkostemp(errpath, O_CLOEXEC);
    if (err_fd >= 0) unlink(errpath); /* nothing has to drain it; read when something fails */
    if (!a || err_fd < 0) {
        snprintf(err, err_size, "cannot set up the ssh forward: %s", strerror(errno));
        free(a);
        if (err_fd >= 0) close(err_fd);
        rmdir(dir);
        return NULL;
    }
    char path_buf[1024], opt[1024];
    arg(a, "%s", program);
    arg(a, "%s", "-N");
    arg(a, "%s", "-T");
    arg(a, "%s", "-e");
    arg(a, "%s", "none");
    if (hipr_url_query(url, "ssh_config", 0, q, sizeof q)) {
        expand_user(q, path_buf, sizeof path_buf);
        arg(a, "%s", "-F");
        arg(a, "%s", path_buf);
    }
    /* ssh keeps the first value given for an option: the caller's go first. */
    for (const char *key = "option"; key; key = strcmp(key, "option") == 0 ? "options" : NULL)
        for (int i = 0; hipr_url_query(url, key, i, opt, sizeof opt); i++) {
            if (!strchr(opt, '=') && !strchr(opt, ' ')) {
                snprintf(err, err_size, "ssh option '%s' must look like Name=value", opt);
                free(a);
                close(err_fd);
                rmdir(dir);
                return NULL;
            }
            arg(a, "%s", "-o");
            arg(a, "%s", opt);
        }
    if (hipr_url_query(url, "identity", 0, q, sizeof q)) {
        expand_user(q, path_buf, sizeof path_buf);
        arg(a, "%s", "-i");
        arg(a, "%s", path_buf);
        arg(a, "%s", "-o");
        arg(a, "%s", "IdentitiesOnly=yes");
    }
    if (hipr_url_query(url, "known_hosts", 0, q, sizeof q)) {
        expand_user(q, path_buf, sizeof path_buf);
        arg(a, "%s", "-o");
        arg(a, "UserKnownHostsFile=%s", path_buf);
    }
    char num[32];
    snprintf(num, sizeof num, "%d", (int)ceil(connect_timeout_s < 1 ? 1 : connect_timeout_s));
    arg(a, "%s", "-o");
    arg(a, "ConnectTimeout=%s", num);
    static const char *const fixed[] = {
        /* Never prompt: a password or host-key question would hang the program. */
        "BatchMode=yes",
        /* Fail at once, with ssh's reason, when the forward cannot be set up. */
        "ExitOnForwardFailure=yes",
        /* Own the connection: a shared master would outlive the tunnel. */
        "ControlMaster=no", "ControlPath=none",
        /* The local socket is for this process only. */
        "StreamLocalBindMask=0177",
        /* Notice a dead network within about a minute, as a dropped link. */
        "ServerAliveInterval=15", "ServerAliveCountMax=4"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
        arg(a, "%s", "-o");
        arg(a, "%s", fixed[i]);
    }
    if (u->port > 0) {
        snprintf(num, sizeof num, "%d", u->port);
        arg(a, "%s", "-p");
        arg(a, "%s", num);
    }
    if (u->user[0]) {
        arg(a, "%s", "-l");
        arg(a, "%s", u->user);
    }
    char forward[sizeof local + sizeof target];
    snprintf(forward, sizeof forward, "%s:%s", local, target);
    arg(a, "%s", "-L");
    arg(a, "%s", forward);
    arg(a, "%s", "--");
    arg(a, "%s", u->host);

    char what[900];
    snprintf(what, sizeof what, "ssh %.390s -> %.500s", dest, target);
    pid_t pid = spawn(a->argv, err_fd);
    free(a);
    if (pid < 0) {
        snprintf(err, err_size, "%s: cannot start ssh: %s", what, strerror(errno));
        close(err_fd);
        rmdir(dir);
        return NULL;
    }
    /* The socket appears once ssh has authenticated and set the forward up. */
    double deadline = now_s() + total;
    long delay_us = 5000;
    int fd = -1;
    char tail[SSH_STDERR_TAIL];
    for (;;) {
        if (is_socket(local)) {
            fd = connect_unix(local, deadline - now_s() > 0.001 ? deadline - now_s() : 0.001, err,
                              err_size);
            break;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            read_tail(err_fd, 0, tail, sizeof tail);
            if (!tail[0])
                snprintf(tail, sizeof tail, "ssh exited with status %d",
                         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            snprintf(err, err_size, "%s: could not connect: %s%s", what, tail, ssh_hint(tail));
            pid = -1;
            break;
        }
        if (now_s() >= deadline) {
            read_tail(err_fd, 0, tail, sizeof tail);
            snprintf(err, err_size, "%s: could not connect: ssh did not finish connecting within %g s%s%s",
                     what, total, tail[0] ? ": " : "", tail);
            break;
        }
        struct timespec ts = {0, delay_us * 1000};
        nanosleep(&ts, NULL);
        delay_us = delay_us * 2 > 50000 ? 50000 : delay_us * 2;
    }
    /* Connected once; then nobody else may use the tunnel. */
    unlink(local);
    rmdir(dir);
    hipr_link *l = fd >= 0 ? new_link(fd, K_SSH) : NULL;
    if (!l) {
        end_ssh(pid);
        close(err_fd);
        return NULL;
    }
    l->ssh_pid = pid;
    l->ssh_err_fd = err_fd;
    l->ssh_err_mark = lseek(err_fd, 0, SEEK_END);
    snprintf(l->failure, sizeof l->failure, "%.590s", what); /* the description, until a failure */
    return l;
}

/* --- the link ---------------------------------------------------------------------------- */

hipr_link *hipr_link_open(const char *url, double timeout_s, char *err, size_t err_size) {
    err[0] = '\0';
    parsed_url u;
    if (strncmp(url, "unix://", 7) == 0) {
        char path[512];
        snprintf(path, sizeof path, "%.*s", (int)strcspn(url + 7, "?"), url + 7);
        int fd = connect_unix(path, timeout_s, err, err_size);
        hipr_link *l = fd >= 0 ? new_link(fd, K_UNIX) : NULL;
        if (fd >= 0 && !l) snprintf(err, err_size, "out of memory");
        return l;
    }
    int tcp = strncmp(url, "tcp://", 6) == 0;
    int tls = strncmp(url, "tls://", 6) == 0;
    int ssh = strncmp(url, "ssh://", 6) == 0;
    if (!tcp && !tls && !ssh) {
        snprintf(err, err_size,
                 "unsupported worker URL %s (tcp://HOST:PORT, unix:///PATH, tls://HOST:PORT or "
                 "ssh://[USER@]HOST/SOCKET)",
                 url);
        return NULL;
    }
    if (parse_url(url, &u, err, err_size) < 0) return NULL;
    if (tls) return open_tls(url, &u, timeout_s, err, err_size);
    if (ssh) return open_ssh(url, &u, timeout_s, err, err_size);
    int fd = connect_tcp(u.host[0] ? u.host : "127.0.0.1", u.port > 0 ? u.port : DEFAULT_TCP_PORT,
                         "tcp", timeout_s, err, err_size);
    hipr_link *l = fd >= 0 ? new_link(fd, K_TCP) : NULL;
    if (fd >= 0 && !l) snprintf(err, err_size, "out of memory");
    return l;
}

static void free_link(hipr_link *l, int polite) {
    if (l->ssl) {
        if (polite) {
            /* close_notify when it costs no waiting; the peer's is not waited for. */
            pipe_guard g;
            pipe_block(&g);
            int flags = fcntl(l->fd, F_GETFL);
            if (flags >= 0 && fcntl(l->fd, F_SETFL, flags | O_NONBLOCK) == 0) SSL_shutdown(l->ssl);
            pipe_unblock(&g);
        }
        SSL_free(l->ssl);
    }
    if (l->ctx) SSL_CTX_free(l->ctx);
    if (l->fd >= 0) close(l->fd);
    if (polite) end_ssh(l->ssh_pid);
    if (l->ssh_err_fd >= 0) close(l->ssh_err_fd);
    ERR_clear_error();
    free(l);
}

void hipr_link_close(hipr_link *l) {
    if (l) free_link(l, 1);
}

void hipr_link_forget(hipr_link *l) {
    if (l) free_link(l, 0);
}

const char *hipr_link_kind(const hipr_link *l) { return KIND_NAMES[l->kind]; }

static void note_tls_failure(hipr_link *l) {
    char reason[300];
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    if (!r) return;
    snprintf(reason, sizeof reason, "%s", r);
    snprintf(l->failure, sizeof l->failure, "TLS connection failed: %s%s", reason,
             tls_hint(reason));
}

/* A write failed because the worker closed the link: under TLS 1.3 a worker that
 * refuses this client's certificate (or its lack of one) says so in an alert sent
 * after the handshake, which may be waiting to be read. */
static void tls_why_closed(hipr_link *l) {
    struct pollfd p = {.fd = l->fd, .events = POLLIN};
    if (poll(&p, 1, 200) == 1) {
        char scratch[256];
        ERR_clear_error();
        int flags = fcntl(l->fd, F_GETFL);
        if (flags >= 0 && fcntl(l->fd, F_SETFL, flags | O_NONBLOCK) == 0) {
            (void)SSL_read(l->ssl, scratch, sizeof scratch);
            fcntl(l->fd, F_SETFL, flags);
        }
        note_tls_failure(l);
    }
    if (!l->failure[0] && !l->received)
        snprintf(l->failure, sizeof l->failure,
                 "the worker closed the TLS connection before answering (does it require a "
                 "client certificate? set HIPR_TLS_CERT and HIPR_TLS_KEY)");
}

static int tls_send(hipr_link *l, const void *data, size_t n) {
    const char *p = data;
    int rc = 0;
    pipe_guard g;
    pipe_block(&g);
    ERR_clear_error();
    while (n) {
        int chunk = n > (1u << 30) ? 1 << 30 : (int)n;
        int k = SSL_write(l->ssl, p, chunk);
        if (k <= 0) {
            int e = SSL_get_error(l->ssl, k);
            if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) continue;
            if (e == SSL_ERROR_SSL) note_tls_failure(l);
            else tls_why_closed(l);
            rc = -1;
            break;
        }
        p += k;
        n -= (size_t)k;
    }
    pipe_unblock(&g);
    return rc;
}

int hipr_link_send(hipr_link *l, const struct iovec *iov, int iovcnt) {
    if (l->ssl) {
        for (int i = 0; i < iovcnt; i++)
            if (iov[i].iov_len && tls_send(l, iov[i].iov_base, iov[i].iov_len) < 0) return -1;
        return 0;
    }
    struct iovec local[64];
    if (iovcnt > 64) {
        for (int i = 0; i < iovcnt; i++)
            if (hipr_link_send(l, &iov[i], 1) < 0) return -1;
        return 0;
    }
    memcpy(local, iov, (size_t)iovcnt * sizeof *iov);
    struct iovec *v = local;
    int left = iovcnt;
    while (left && v->iov_len == 0) {
        v++;
        left--;
    }
    while (left) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = v;
        msg.msg_iovlen = (size_t)left;
        ssize_t k = sendmsg(l->fd, &msg, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        size_t done = (size_t)k;
        while (left && done >= v->iov_len) {
            done -= v->iov_len;
            v++;
            left--;
        }
        if (left) {
            v->iov_base = (char *)v->iov_base + done;
            v->iov_len -= done;
        }
    }
    return 0;
}

static long tls_recv(hipr_link *l, void *buf, size_t n) {
    ERR_clear_error();
    for (;;) {
        int k = SSL_read(l->ssl, buf, n > (1u << 30) ? 1 << 30 : (int)n);
        if (k > 0) {
            l->received = 1;
            return k;
        }
        int e = SSL_get_error(l->ssl, k);
        if (e == SSL_ERROR_ZERO_RETURN) return 0;
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) continue;
        if (e == SSL_ERROR_SYSCALL && errno == 0) return 0;
        if (e == SSL_ERROR_SSL) note_tls_failure(l);
        else if (!l->received) tls_why_closed(l);
        return -1;
    }
}

long hipr_link_recv(hipr_link *l, void *buf, size_t n) {
    if (l->ssl) return tls_recv(l, buf, n);
    for (;;) {
        ssize_t k = recv(l->fd, buf, n, 0);
        if (k < 0 && errno == EINTR) continue;
        return (long)k;
    }
}

long hipr_link_recv_nowait(hipr_link *l, void *buf, size_t n) {
    if (l->ssl) {
        if (SSL_pending(l->ssl) > 0) return tls_recv(l, buf, n);
        struct pollfd p = {.fd = l->fd, .events = POLLIN};
        int rc = poll(&p, 1, 0);
        if (rc == 0) return -2;
        return rc < 0 && errno != EINTR ? -1 : rc < 0 ? -2 : tls_recv(l, buf, n);
    }
    for (;;) {
        ssize_t k = recv(l->fd, buf, n, MSG_DONTWAIT);
        if (k >= 0) return (long)k;
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? -2 : -1;
    }
}

int hipr_link_wait_readable(hipr_link *l, int timeout_ms) {
    if (l->ssl && SSL_pending(l->ssl) > 0) return 1;
    struct pollfd p = {.fd = l->fd, .events = POLLIN};
    for (;;) {
        int rc = poll(&p, 1, timeout_ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return -1;
        return rc > 0;
    }
}

int hipr_link_wait_readable_or(hipr_link *l, int wake_fd, int timeout_ms) {
    if (l->ssl && SSL_pending(l->ssl) > 0) return 1;
    struct pollfd p[2] = {{.fd = l->fd, .events = POLLIN}, {.fd = wake_fd, .events = POLLIN}};
    for (;;) {
        int rc = poll(p, 2, timeout_ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return -1;
        return rc == 0 ? 0 : p[0].revents ? 1 : 2;
    }
}

int hipr_link_nap(hipr_link *l, double seconds) {
    if (l->ssl && SSL_pending(l->ssl) > 0) return 1;
    if (seconds <= 0) return 0;
    struct pollfd p = {.fd = l->fd, .events = POLLIN};
    struct timespec t = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    int rc = ppoll(&p, 1, &t, NULL);
    if (rc < 0) return errno == EINTR ? 0 : -1;
    return rc > 0;
}

void hipr_link_set_send_timeout(hipr_link *l, double seconds) {
    struct timeval tv = {0, 0};
    if (seconds > 0) {
        tv.tv_sec = (time_t)seconds;
        tv.tv_usec = (suseconds_t)((seconds - (double)tv.tv_sec) * 1e6);
    }
    setsockopt(l->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

const char *hipr_link_failure(hipr_link *l) {
    if (l->kind == K_SSH) {
        char tail[SSH_STDERR_TAIL];
        read_tail(l->ssh_err_fd, l->ssh_err_mark, tail, sizeof tail);
        if (!tail[0]) return "";
        char what[300];
        snprintf(what, sizeof what, "%.290s", l->failure);
        char *cut = strstr(what, ": the tunnel failed");
        if (cut) *cut = '\0';
        snprintf(l->failure, sizeof l->failure, "%.200s: the tunnel failed: %.300s%s", what, tail,
                 ssh_hint(tail));
        return l->failure;
    }
    return l->failure;
}
