/* TCP between the processes of a data-parallel job: the rendezvous (every rank meets rank 0,
 * which checks they run the same job and hands out the NCCL unique id) and, for the host
 * backends, the per-step sum of every rank's values through rank 0 (a star: small models, no
 * GPU; NCCL does the real work on GPUs).
 *
 * Nothing assumes one host: rank 0 listens on every interface, the others resolve the master
 * address (a name or an IPv4/IPv6 address) and retry until it listens; numbers travel
 * little-endian. Every wait (connect, accept, send, receive) is bounded by the job's timeout, and
 * a peer that closes its connection is noticed at once: a rank that dies or hangs makes the
 * others fail with a message naming it, never wait forever. */
#include "dist/dist.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAGIC_HELLO 0x50444754u    /* "TGDP" */
#define MAGIC_REPLY 0x52444754u    /* "TGDR" */
#define MAGIC_SUM 0x53444754u      /* "TGDS" */
#define VERSION 1
#define HELLO_BYTES 32
#define SUM_HEADER 24

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ----- little-endian numbers ----- */

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Doubles travel in the host's byte order when it is little-endian (every machine we run on);
 * a big-endian host swaps them in place before sending and after receiving. */
static void doubles_le(double *v, size_t n) {
    const uint16_t one = 1;
    if (*(const uint8_t *)&one) return;
    for (size_t i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &v[i], 8);
        u = __builtin_bswap64(u);
        memcpy(&v[i], &u, 8);
    }
}

/* ----- bounded waits ----- */

typedef enum { IO_OK, IO_CLOSED, IO_TIMEOUT, IO_ERROR } io_status;

/* Wait until fd is ready for `events` or the deadline passes. */
static io_status wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return IO_TIMEOUT;
        struct pollfd p = { fd, events, 0 };
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        int r = poll(&p, 1, ms);
        if (r > 0) return IO_OK;
        if (r < 0 && errno != EINTR) return IO_ERROR;
    }
}

static io_status send_all(int fd, const void *buf, size_t len, double deadline) {
    const char *p = buf;
    while (len > 0) {
        io_status w = wait_fd(fd, POLLOUT, deadline);
        if (w != IO_OK) return w;
        ssize_t k = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (k < 0) return errno == EPIPE || errno == ECONNRESET ? IO_CLOSED : IO_ERROR;
        p += k;
        len -= (size_t)k;
    }
    return IO_OK;
}

static io_status recv_all(int fd, void *buf, size_t len, double deadline) {
    char *p = buf;
    while (len > 0) {
        io_status w = wait_fd(fd, POLLIN, deadline);
        if (w != IO_OK) return w;
        ssize_t k = recv(fd, p, len, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (k == 0 || (k < 0 && errno == ECONNRESET)) return IO_CLOSED;
        if (k < 0) return IO_ERROR;
        p += k;
        len -= (size_t)k;
    }
    return IO_OK;
}

static void set_options(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);   /* small messages: no Nagle delay */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* ----- rank 0: listen, check every hello, answer ----- */

/* A socket listening on `port` on every interface (IPv6 accepting IPv4 too where the host has
 * IPv6), or -1 with err set. */
static int listen_any(int port, int backlog, tg_error *err) {
    char serv[16];
    snprintf(serv, sizeof serv, "%d", port);
    struct addrinfo hints = { .ai_flags = AI_PASSIVE, .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res = NULL;
    int rc = getaddrinfo(NULL, serv, &hints, &res);
    if (rc) {
        tg_seterr(err, "rendezvous: rank 0 cannot listen on port %d: %s", port, gai_strerror(rc));
        return -1;
    }
    int fd = -1, e = 0;
    for (int pass = 0; pass < 2 && fd < 0; pass++)   /* IPv6 (dual stack) first, then IPv4 */
        for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
            if ((pass == 0) != (a->ai_family == AF_INET6)) continue;
            fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) { e = errno; continue; }
            int one = 1, zero = 0;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, backlog)) {
                e = errno;
                close_fd(&fd);
            }
        }
    freeaddrinfo(res);
    if (fd < 0) tg_seterr(err, "rendezvous: rank 0 cannot listen on port %d: %s", port, strerror(e));
    else fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* Send a rank rank 0's answer: the payload, or why the job cannot start. */
static void reply(int fd, bool ok, const uint8_t *payload, const char *why, double deadline) {
    uint8_t msg[12 + TG_ERROR_LEN];
    size_t len = ok ? DIST_ID_BYTES : strlen(why);
    if (len > TG_ERROR_LEN) len = TG_ERROR_LEN;
    put32(msg, MAGIC_REPLY);
    put32(msg + 4, ok ? 0 : 1);
    put32(msg + 8, (uint32_t)len);
    memcpy(msg + 12, ok ? (const void *)payload : (const void *)why, len);
    send_all(fd, msg, 12 + len, deadline);
}

typedef struct { int rank, world, n_local; uint64_t fingerprint; } hello;

static void hello_encode(uint8_t *p, const hello *h) {
    memset(p, 0, HELLO_BYTES);
    put32(p, MAGIC_HELLO);
    put32(p + 4, VERSION);
    put32(p + 8, (uint32_t)h->rank);
    put32(p + 12, (uint32_t)h->world);
    put32(p + 16, (uint32_t)h->n_local);
    put64(p + 24, h->fingerprint);
}

/* Why a hello cannot join this job, or NULL. */
static const char *hello_check(const uint8_t *p, const hello *mine, const int *fd, hello *h, char *why, size_t len) {
    if (get32(p) != MAGIC_HELLO || get32(p + 4) != VERSION) return "";   /* not one of ours: ignored */
    *h = (hello){ (int)get32(p + 8), (int)get32(p + 12), (int)get32(p + 16), get64(p + 24) };
    if (h->world != mine->world)
        snprintf(why, len, "rank %d says the world has %d processes, rank 0 says %d", h->rank, h->world, mine->world);
    else if (h->rank <= 0 || h->rank >= mine->world)
        snprintf(why, len, "a process says it is rank %d of a world of %d", h->rank, mine->world);
    else if (fd[h->rank] >= 0)
        snprintf(why, len, "two processes say they are rank %d", h->rank);
    else if (h->n_local != mine->n_local)
        snprintf(why, len, "rank %d has %d replicas, rank 0 has %d: every process needs as many devices",
                 h->rank, h->n_local, mine->n_local);
    else if (h->fingerprint != mine->fingerprint)
        snprintf(why, len, "rank %d runs another job: its parameters or inputs differ from rank 0's", h->rank);
    else return NULL;
    return why;
}

/* The ranks not joined yet, as "1, 3" (for the timeout message). */
static void missing(const int *fd, int world, char *buf, size_t len) {
    size_t k = 0;
    buf[0] = 0;
    for (int r = 1; r < world && k + 16 < len; r++)
        if (fd[r] < 0) k += (size_t)snprintf(buf + k, len - k, "%s%d", k ? ", " : "", r);
}

static bool serve(dist_net *n, const dist_settings *s, const hello *mine, const uint8_t *payload, tg_error *err) {
    int lfd = listen_any(s->port, s->world, err);
    if (lfd < 0) return false;
    double deadline = now_s() + s->timeout_s;
    int joined = 0;
    char why[TG_ERROR_LEN] = "";
    while (joined < s->world - 1 && !why[0]) {
        io_status w = wait_fd(lfd, POLLIN, deadline);
        if (w == IO_TIMEOUT) {
            char who[200];
            missing(n->fd, s->world, who, sizeof who);
            snprintf(why, sizeof why, "rank%s %s did not join rank 0 (port %d) within %g s", strchr(who, ',') ? "s" : "",
                     who, s->port, s->timeout_s);
            break;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        set_options(fd);
        uint8_t p[HELLO_BYTES];
        hello h;
        const char *bad = recv_all(fd, p, sizeof p, deadline) == IO_OK ? hello_check(p, mine, n->fd, &h, why, sizeof why)
                                                                       : "";
        if (bad && !bad[0]) { close(fd); continue; }   /* a stranger or a dropped connection: keep waiting */
        if (bad) {
            reply(fd, false, NULL, why, deadline);
            close(fd);
            break;
        }
        n->fd[h.rank] = fd;
        joined++;
    }
    close(lfd);
    for (int r = 1; r < s->world; r++)
        if (n->fd[r] >= 0) reply(n->fd[r], !why[0], payload, why, deadline);
    if (why[0]) tg_seterr(err, "rendezvous: %s", why);
    return !why[0];
}

/* ----- the other ranks: connect, say hello, take the answer ----- */

/* One connection attempt to each address of rank 0, bounded by the deadline; the socket or -1
 * (*e: the last errno). */
static int try_connect(struct addrinfo *res, double deadline, int *e) {
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) { *e = errno; continue; }
        set_options(fd);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
        int ce = errno;
        if (ce == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) == IO_OK) {
            int so = 0;
            socklen_t sl = sizeof so;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl);
            if (so == 0) return fd;
            *e = so;
        } else if (ce != EINPROGRESS) {
            *e = ce;   /* an attempt cut short by the deadline keeps the previous attempt's reason */
        }
        close(fd);
    }
    return -1;
}

static int connect_master(const dist_settings *s, double deadline, tg_error *err) {
    char serv[16];
    snprintf(serv, sizeof serv, "%d", s->port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res = NULL;
    int rc = getaddrinfo(s->addr, serv, &hints, &res);
    if (rc) {
        tg_seterr(err, "rendezvous: cannot resolve rank 0's address '%s': %s", s->addr, gai_strerror(rc));
        return -1;
    }
    int fd = -1, e = ETIMEDOUT;
    while ((fd = try_connect(res, deadline, &e)) < 0 && now_s() < deadline) {   /* rank 0 may start later */
        struct timespec pause = { 0, 50 * 1000 * 1000 };
        nanosleep(&pause, NULL);
    }
    freeaddrinfo(res);
    if (fd < 0)
        tg_seterr(err, "rendezvous: could not reach rank 0 at %s:%d within %g s (%s)", s->addr, s->port, s->timeout_s,
                  strerror(e));
    return fd;
}

static const char *io_name(io_status st) {
    return st == IO_CLOSED ? "closed the connection" : st == IO_TIMEOUT ? "did not answer in time" : "failed (socket error)";
}

static bool join(dist_net *n, const dist_settings *s, const hello *mine, uint8_t *payload, tg_error *err) {
    double deadline = now_s() + s->timeout_s;
    int fd = connect_master(s, deadline, err);
    if (fd < 0) return false;
    n->fd[0] = fd;
    uint8_t p[HELLO_BYTES], head[12];
    hello_encode(p, mine);
    io_status st = send_all(fd, p, sizeof p, deadline);
    if (st == IO_OK) st = recv_all(fd, head, sizeof head, deadline);
    if (st != IO_OK) {
        tg_seterr(err, "rendezvous: rank 0 at %s:%d %s within %g s", s->addr, s->port, io_name(st), s->timeout_s);
        return false;
    }
    uint32_t len = get32(head + 8);
    char body[TG_ERROR_LEN + 1] = "";
    if (get32(head) != MAGIC_REPLY || len > TG_ERROR_LEN || (get32(head + 4) == 0 && len != DIST_ID_BYTES)) {
        tg_seterr(err, "rendezvous: %s:%d answered, but not as tensorgrad's rank 0", s->addr, s->port);
        return false;
    }
    if (recv_all(fd, body, len, deadline) != IO_OK) {
        tg_seterr(err, "rendezvous: rank 0 closed the connection before answering");
        return false;
    }
    if (get32(head + 4) != 0) {
        tg_seterr(err, "rendezvous: rank 0 refused the job: %s", body);
        return false;
    }
    memcpy(payload, body, DIST_ID_BYTES);
    return true;
}

bool net_rendezvous(dist_net *n, const dist_settings *s, uint64_t fingerprint, uint8_t payload[DIST_ID_BYTES],
                    tg_error *err) {
    *n = (dist_net){ .rank = s->rank, .world = s->world, .timeout_s = s->timeout_s };
    n->fd = tg_alloc(sizeof(int) * (size_t)(s->world + 1));
    if (!n->fd) {
        tg_seterr(err, "rendezvous: out of memory");
        return false;
    }
    for (int r = 0; r <= s->world; r++) n->fd[r] = -1;
    hello mine = { s->rank, s->world, s->n_local, fingerprint };
    bool ok = s->rank == 0 ? serve(n, s, &mine, payload, err) : join(n, s, &mine, payload, err);
    if (!ok) net_close(n);
    return ok;
}

void net_close(dist_net *n) {
    for (int r = 0; n->fd && r < n->world; r++) close_fd(&n->fd[r]);
    free(n->fd);
    n->fd = NULL;
}

/* ----- the per-step sum ----- */

static void sum_header(uint8_t *p, uint32_t magic, uint32_t status, uint64_t call, uint64_t count) {
    put32(p, magic);
    put32(p + 4, status);
    put64(p + 8, call);
    put64(p + 16, count);
}

/* Rank 0 tells every rank still connected that the step failed: status 1 + the first rank that
 * failed (rank 0 itself included). */
static void announce_failure(dist_net *n, int failed, double deadline) {
    uint8_t h[SUM_HEADER];
    sum_header(h, MAGIC_SUM, 1 + (uint32_t)failed, n->calls, 0);
    for (int r = 1; r < n->world; r++)
        if (n->fd[r] >= 0) send_all(n->fd[r], h, sizeof h, deadline);
}

/* Rank 0: every rank's header and, from those that computed their share, its values, added into
 * v. A rank that says it failed is noted (*failed, the first such) and the exchange goes on, so
 * every connection stays in step; a rank that closed, went silent or broke the protocol ends it
 * (false, *broken). */
static bool gather(dist_net *n, double *v, size_t count, double *tmp, double deadline, int *failed, bool *broken,
                   tg_error *err) {
    for (int r = 1; r < n->world; r++) {
        uint8_t h[SUM_HEADER];
        io_status st = recv_all(n->fd[r], h, sizeof h, deadline);
        bool ours = st == IO_OK && get32(h) == MAGIC_SUM && get64(h + 8) == n->calls;
        bool share = ours && get32(h + 4) == 0;
        if (ours && share && get64(h + 16) != count) {
            tg_seterr(err, "rank %d sent %llu values, rank 0 has %zu: the ranks run different jobs", r,
                      (unsigned long long)get64(h + 16), count);
            *failed = r;
            *broken = true;
            return false;
        }
        if (share) st = recv_all(n->fd[r], tmp, count * sizeof(double), deadline);
        if (!ours || st != IO_OK) {
            if (st == IO_CLOSED) tg_seterr(err, "rank %d closed its connection (it exited or crashed)", r);
            else if (st == IO_TIMEOUT) tg_seterr(err, "rank %d sent nothing within %g s (hung or far behind)", r, n->timeout_s);
            else tg_seterr(err, "rank %d broke the protocol at exchange %llu", r, (unsigned long long)n->calls);
            close_fd(&n->fd[r]);
            *failed = r;
            *broken = true;
            return false;
        }
        if (!share && *failed < 0) {
            *failed = r;
            tg_seterr(err, "rank %d could not compute its share of this step", r);
        }
        if (!share) continue;
        doubles_le(tmp, count);
        for (size_t i = 0; i < count; i++) v[i] += tmp[i];
    }
    return *failed < 0;
}

static bool sum_root(dist_net *n, double *v, size_t count, bool ok, bool *broken, tg_error *err) {
    double deadline = now_s() + n->timeout_s;
    double *tmp = tg_alloc(sizeof(double) * (count + 1));
    int failed = ok && tmp ? -1 : 0;
    tg_error e;
    if (!tmp) tg_seterr(&e, "out of memory for the step's sum");
    else if (!ok) tg_seterr(&e, "rank 0 could not compute its share of this step");
    bool all = gather(n, v, count, tmp ? tmp : v, deadline, &failed, broken, &e) && failed < 0;
    free(tmp);
    if (!all) {
        announce_failure(n, failed, deadline);
        tg_seterr(err, "%s", e.msg);
        return false;
    }
    uint8_t h[SUM_HEADER];
    sum_header(h, MAGIC_SUM, 0, n->calls, count);
    doubles_le(v, count);
    for (int r = 1; r < n->world; r++) {
        io_status st = send_all(n->fd[r], h, sizeof h, deadline);
        if (st == IO_OK) st = send_all(n->fd[r], v, count * sizeof(double), deadline);
        if (st != IO_OK && all) {
            tg_seterr(err, "rank %d %s while rank 0 sent the sum", r, io_name(st));
            all = false;
            *broken = true;
        }
    }
    doubles_le(v, count);
    return all;
}

static bool sum_peer(dist_net *n, double *v, size_t count, bool ok, bool *broken, tg_error *err) {
    double deadline = now_s() + n->timeout_s;
    int fd = n->fd[0];
    uint8_t h[SUM_HEADER];
    sum_header(h, MAGIC_SUM, ok ? 0 : 1, n->calls, count);
    io_status st = send_all(fd, h, sizeof h, deadline);
    doubles_le(v, count);
    if (st == IO_OK && ok) st = send_all(fd, v, count * sizeof(double), deadline);
    if (st == IO_OK) st = recv_all(fd, h, sizeof h, deadline);
    *broken = true;
    if (st != IO_OK) {
        tg_seterr(err, "rank 0 %s (it failed, exited or hung; waited up to %g s)", io_name(st), n->timeout_s);
        return false;
    }
    if (get32(h) != MAGIC_SUM || get64(h + 8) != n->calls) {
        tg_seterr(err, "rank 0 broke the protocol at exchange %llu", (unsigned long long)n->calls);
        return false;
    }
    uint32_t status = get32(h + 4);
    if (status == 0 && recv_all(fd, v, count * sizeof(double), deadline) != IO_OK) {
        tg_seterr(err, "rank 0 closed the connection while sending the sum");
        return false;
    }
    *broken = false;
    if (status != 0) {
        int who = (int)status - 1;
        if (who == n->rank) tg_seterr(err, "rank %d (this process) could not compute its share of this step", who);
        else tg_seterr(err, "rank %d failed this step (it could not compute its share, or exited or hung)", who);
        return false;
    }
    doubles_le(v, count);
    return true;
}

bool net_sum(dist_net *n, double *v, size_t count, bool ok, bool *broken, tg_error *err) {
    *broken = false;
    for (int r = n->rank == 0 ? 1 : 0; r < (n->rank == 0 ? n->world : 1); r++)
        if (!n->fd || n->fd[r] < 0) {
            tg_seterr(err, "the connection to rank %d is closed (an earlier step failed)", r);
            *broken = true;
            return false;
        }
    n->calls++;
    bool done = n->rank == 0 ? sum_root(n, v, count, ok, broken, err) : sum_peer(n, v, count, ok, broken, err);
    if (*broken)   /* the streams are out of step, or a peer is gone: nobody may use them again */
        for (int r = 0; r < n->world; r++) close_fd(&n->fd[r]);
    return done;
}
