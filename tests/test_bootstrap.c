// The TCP bootstrap (dist/bootstrap_tcp.h), every rank a thread of this process, all on
// 127.0.0.1: every rank arrives (some before rank 0 listens), a rank or rank 0 missing, and the
// connections that must neither stall rank 0 nor take a rank's place: a silent client, an
// impostor without the token, a second process claiming a rank, a garbage sender, and 8 ranks
// arriving in random order with two silent clients among them. Rank 0's log must name every
// refused connection once; no refused connection may receive any of the bytes. Also the
// launch-level wrapper (MASTER_PORT + 1, the job token) and its warning without a token.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/timer.h"
#include "dist/bootstrap_tcp.h"
#include "dist/comm.h"
#include "tests/testlib.h"

enum {
    ID_BYTES = 128,
    CHALLENGE_MAX = 36,  // what rank 0 sends before a hello is proved: magic word and nonce
};
#define TOKEN "job-4242"
// Well below TCP_HELLO_TIMEOUT_S: a bootstrap that finishes within it was not held up by a
// silent connection, which rank 0 would otherwise have waited on for the whole hello deadline.
#define UNBLOCKED_S 1.5

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static unsigned char id_byte(int i) { return (unsigned char)(i * 37 + 11); }

static int is_id(const unsigned char *b) {
    for (int i = 0; i < ID_BYTES; i++)
        if (b[i] != id_byte(i)) return 0;
    return 1;
}

static int is_zero(const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

// A port the kernel reports free right now (bound to port 0, then released), so neither another
// run of the suite nor an ephemeral port in use can collide with the test's listener.
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

// ---- ranks: one thread each ----

typedef struct {
    TcpBootstrap b;
    unsigned char buf[ID_BYTES];  // rank 0: the id; the others: what they received
    int rc;
    double done_at;  // when tcp_broadcast returned
    char err[512];
    pthread_t th;
} Rank;

static void *rank_main(void *arg) {
    Rank *r = arg;
    r->rc = tcp_broadcast(&r->b, r->buf, ID_BYTES, r->err, sizeof r->err);
    r->done_at = now_seconds();
    return NULL;
}

// Starts `rank` of `world` on its thread; log: rank 0's (NULL for the others).
static void rank_start(Rank *r, int port, int rank, int world, const char *token, double timeout_s,
                       FILE *log) {
    memset(r, 0, sizeof *r);
    r->b = (TcpBootstrap){.addr = "127.0.0.1", .port = port, .rank = rank, .world = world,
                          .token = token, .timeout_s = timeout_s, .log = log};
    if (rank == 0)
        for (int i = 0; i < ID_BYTES; i++)
            r->buf[i] = id_byte(i);
    pthread_create(&r->th, NULL, rank_main, r);
}

static void rank_join(Rank *r) { pthread_join(r->th, NULL); }

// Runs one rank to its end on this thread's behalf.
static void rank_run(Rank *r, int port, int rank, int world, const char *token, double timeout_s) {
    rank_start(r, port, rank, world, token, timeout_s, NULL);
    rank_join(r);
}

static int got_id(const Rank *r) { return r->rc == 0 && is_id(r->buf); }

// A rank refused by rank 0: an error that says so, and not one byte in its buffer.
static int refused(const Rank *r) {
    return r->rc != 0 && strstr(r->err, "refused this rank") && is_zero(r->buf, ID_BYTES);
}

// ---- rank 0's log ----

// Lines of the log that hold both a and b (NULL: any line).
static int log_lines(FILE *log, const char *a, const char *b) {
    char line[1024];
    int n = 0;
    rewind(log);
    while (fgets(line, sizeof line, log))
        n += (!a || strstr(line, a)) && (!b || strstr(line, b));
    return n;
}

static int log_count(FILE *log, const char *needle) { return log_lines(log, needle, NULL); }

// The log lines for a connection from local port `port` (rank 0 names the peer's address).
static int log_names(FILE *log, int port, const char *why) {
    char who[64];
    snprintf(who, sizeof who, "from 127.0.0.1:%d: ", port);
    return log_lines(log, who, why);
}

// ---- strays: raw connections that are not ranks ----

typedef struct {
    int fd;
    int port;  // its own (local) port: how rank 0's log names it
} Stray;

// Connects to 127.0.0.1:port, retrying while rank 0 starts (at most 5 s); fd -1 when it cannot.
static Stray stray_open(int port) {
    Stray s = {.fd = -1};
    const struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                   .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int attempt = 0; attempt < 100 && s.fd < 0; attempt++) {
        s.fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s.fd, (const struct sockaddr *)&sa, sizeof sa) != 0) {
            close(s.fd), s.fd = -1;
            sleep_s(0.05);
        }
    }
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    if (s.fd >= 0 && getsockname(s.fd, (struct sockaddr *)&me, &len) == 0)
        s.port = ntohs(me.sin_port);
    return s;
}

static int stray_send(const Stray *s, const void *bytes, size_t n) {
    return s->fd >= 0 && send(s->fd, bytes, n, MSG_NOSIGNAL) == (ssize_t)n;
}

// Reads what rank 0 sent s until it closed the connection, waiting at most wait_s: the bytes
// into got (cap), their count into *n. 1 when rank 0 closed it (end of stream or reset).
static int stray_drain(const Stray *s, unsigned char *got, size_t cap, size_t *n, double wait_s) {
    const double deadline = now_seconds() + wait_s;
    *n = 0;
    while (s->fd >= 0 && now_seconds() < deadline) {
        struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)((deadline - now_seconds()) * 1e3) + 1) <= 0) continue;
        const ssize_t k = recv(s->fd, got + *n, cap - *n, 0);
        if (k == 0 || (k < 0 && errno == ECONNRESET)) return 1;
        if (k < 0 || (*n += (size_t)k) == cap) return 0;
    }
    return 0;
}

static void stray_close(Stray *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

// Rank 0 closed s within wait_s, having sent it no more than a challenge and none of the id
// (no 16 of its bytes in a row).
static int stray_got_nothing(const Stray *s, double wait_s) {
    unsigned char got[1024], id[ID_BYTES];
    size_t n = 0;
    const int closed = stray_drain(s, got, sizeof got, &n, wait_s);
    for (int i = 0; i < ID_BYTES; i++)
        id[i] = id_byte(i);
    for (size_t at = 0; at + 16 <= n; at++)
        for (int j = 0; j + 16 <= ID_BYTES; j++)
            if (memcmp(got + at, id + j, 16) == 0) return 0;
    return closed && n <= CHALLENGE_MAX;
}

// rank 0's listening address for port in /proc/net/tcp (hex, "0100007F" = 127.0.0.1), or "".
static void listener_addr(int port, char *addr, size_t len) {
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512], local[64];
    unsigned lport, st;
    addr[0] = '\0';
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, " %*d: %63[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x", local, &lport, &st) == 3 &&
            (int)lport == port && st == 0x0A)
            snprintf(addr, len, "%s", local);
    if (f) fclose(f);
}

// ---- the cases ----

static void test_all_arrive(void) {
    Rank r[4];
    FILE *log = tmpfile();
    const int port = free_port();
    for (int i = 1; i < 4; i++)
        rank_start(&r[i], port, i, 4, TOKEN, 20, NULL);
    sleep_s(0.2);  // the ranks start first: they retry until rank 0 listens
    rank_start(&r[0], port, 0, 4, TOKEN, 20, log);
    for (int i = 0; i < 4; i++)
        rank_join(&r[i]);
    EXPECT(r[0].rc == 0, "rank 0 serves 3 ranks: %s", r[0].err);
    for (int i = 1; i < 4; i++)
        EXPECT(got_id(&r[i]), "rank %d received rank 0's bytes: %s", i, r[i].err);
    EXPECT(log_count(log, NULL) == 0, "nothing refused, nothing logged");
    fclose(log);
}

static void test_missing(void) {
    Rank r0, r1;
    const int port = free_port();
    rank_start(&r1, port, 1, 3, TOKEN, 20, NULL);
    rank_start(&r0, port, 0, 3, TOKEN, 1.0, NULL);
    rank_join(&r0), rank_join(&r1);
    EXPECT(r0.rc != 0 && strstr(r0.err, "rank(s) 2 of 3 did not connect"),
           "a missing rank is named: %s", r0.err);
    EXPECT(got_id(&r1), "the rank that arrived received the bytes: %s", r1.err);
    rank_run(&r1, free_port(), 1, 2, TOKEN, 0.5);
    EXPECT(r1.rc != 0 && strstr(r1.err, "rank 1: rank 0 did not answer"),
           "a missing rank 0 is named: %s", r1.err);
}

// A client that connects and sends nothing: the rank behind it is served at once, and the
// silent one is dropped at its own deadline while rank 0 still waits for the others.
static void test_silent(void) {
    Rank r[3];
    FILE *log = tmpfile();
    const int port = free_port();
    const double t0 = now_seconds();
    rank_start(&r[0], port, 0, 3, TOKEN, 10, log);
    Stray silent = stray_open(port);
    EXPECT(silent.fd >= 0, "the silent client connects");
    char addr[64];
    listener_addr(port, addr, sizeof addr);
    EXPECT(strcmp(addr, "0100007F") == 0,
           "rank 0 listens on MASTER_ADDR 127.0.0.1 alone, not every interface: '%s'", addr);
    rank_run(&r[1], port, 1, 3, TOKEN, 10);
    EXPECT(got_id(&r[1]) && r[1].done_at - t0 < UNBLOCKED_S,
           "rank 1 is served behind a silent client within %.2f s (not after its deadline): %s",
           r[1].done_at - t0, r[1].err);
    EXPECT(stray_got_nothing(&silent, TCP_HELLO_TIMEOUT_S + 2) &&
               now_seconds() - t0 < TCP_HELLO_TIMEOUT_S + 1,
           "the silent client is dropped at its deadline, with none of the bytes");
    EXPECT(log_names(log, silent.port, "its hello did not complete within 2 s") == 1,
           "rank 0 logs the silent client once, by its address");
    rank_run(&r[2], port, 2, 3, TOKEN, 10);
    rank_join(&r[0]);
    EXPECT(r[0].rc == 0 && got_id(&r[2]), "rank 2, after the silent client's deadline: %s",
           r[0].err);
    EXPECT(log_count(log, NULL) == 1, "one line in all");
    stray_close(&silent);
    fclose(log);
}

// Impostors before the real rank 1: one with another job's token, one sending the magic word and
// "rank 1" without any proof. Neither receives a byte nor takes rank 1's place.
static void test_impostor(void) {
    Rank r0, imp, r1;
    FILE *log = tmpfile();
    const int port = free_port();
    rank_start(&r0, port, 0, 2, TOKEN, 10, log);
    rank_run(&imp, port, 1, 2, "another-job", 10);
    EXPECT(refused(&imp), "the wrong token is refused, nothing received: %s", imp.err);
    Stray bare = stray_open(port);
    const unsigned char magic_rank1[8] = {'F', 'G', 'P', '2', 0, 0, 0, 1};
    EXPECT(stray_send(&bare, magic_rank1, sizeof magic_rank1), "the bare hello is sent");
    rank_run(&r1, port, 1, 2, TOKEN, 10);
    rank_join(&r0);
    EXPECT(r0.rc == 0 && got_id(&r1), "the real rank 1 is served after them: %s / %s", r0.err,
           r1.err);
    EXPECT(stray_got_nothing(&bare, 1), "the bare hello received nothing and was closed");
    EXPECT(log_count(log, "wrong proof of the job token") == 1, "the wrong token is logged once");
    EXPECT(log_names(log, bare.port, "the bootstrap ended before its hello did") == 1,
           "the bare hello is logged once, by its address");
    EXPECT(log_count(log, NULL) == 2, "two lines in all");
    stray_close(&bare);
    fclose(log);
}

// A second process claiming rank 1 after rank 1 was served, and a proved hello for a rank
// outside the world: refused and reported; rank 2 is still served.
static void test_duplicate(void) {
    Rank r0, r1, dup, outside, r2;
    FILE *log = tmpfile();
    const int port = free_port();
    rank_start(&r0, port, 0, 3, TOKEN, 10, log);
    rank_run(&r1, port, 1, 3, TOKEN, 10);
    rank_run(&dup, port, 1, 3, TOKEN, 10);
    rank_run(&outside, port, 3, 3, TOKEN, 10);
    rank_run(&r2, port, 2, 3, TOKEN, 10);
    rank_join(&r0);
    EXPECT(r0.rc == 0 && got_id(&r1) && got_id(&r2), "ranks 1 and 2 served: %s", r0.err);
    EXPECT(refused(&dup), "the duplicate rank 1 is refused, nothing received: %s", dup.err);
    EXPECT(refused(&outside), "rank 3 of 3 is refused: %s", outside.err);
    EXPECT(log_count(log, "rank 1 already arrived from 127.0.0.1:") == 1,
           "the duplicate is reported once, with the address that holds rank 1");
    EXPECT(log_count(log, "rank 3 is not in 1..2") == 1, "the rank outside the world is reported");
    EXPECT(log_count(log, NULL) == 2, "two lines in all");
    fclose(log);
}

// Bytes that are no hello: more than a hello's worth (dropped on the wrong magic word, at once)
// and a few then the end of the stream.
static void test_garbage(void) {
    Rank r0, r1;
    FILE *log = tmpfile();
    const int port = free_port();
    const double t0 = now_seconds();
    rank_start(&r0, port, 0, 2, TOKEN, 10, log);
    Stray http = stray_open(port), shortie = stray_open(port);
    const char get[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: probe\r\n\r\n";
    EXPECT(stray_send(&http, get, sizeof get - 1), "the request is sent");
    EXPECT(stray_got_nothing(&http, 1) && now_seconds() - t0 < UNBLOCKED_S,
           "a request that is no hello is dropped at once, with none of the bytes");
    EXPECT(stray_send(&shortie, "\x01\x02\x03", 3), "three bytes are sent");
    shutdown(shortie.fd, SHUT_WR);
    EXPECT(stray_got_nothing(&shortie, 1), "a stream that ends before a hello is dropped");
    rank_run(&r1, port, 1, 2, TOKEN, 10);
    rank_join(&r0);
    EXPECT(r0.rc == 0 && got_id(&r1), "rank 1 is served after them: %s", r0.err);
    EXPECT(log_names(log, http.port, "wrong magic word") == 1, "the request is logged once");
    EXPECT(log_names(log, shortie.port, "it closed the connection during its hello") == 1,
           "the short stream is logged once");
    EXPECT(log_count(log, NULL) == 2, "two lines in all");
    stray_close(&http), stray_close(&shortie);
    fclose(log);
}

// 8 ranks in a random order, 20 ms apart, with two silent clients among them; a few orders.
static void test_random_order(void) {
    enum { WORLD = 8, EVENTS = WORLD - 1 + 2, SILENT = -1 };
    unsigned seed = 27;
    for (int round = 0; round < 3; round++) {
        Rank r[WORLD];
        Stray silent[2];
        int order[EVENTS], n_silent = 0;
        for (int i = 0; i < EVENTS; i++)
            order[i] = i < WORLD - 1 ? i + 1 : SILENT;
        for (int i = EVENTS - 1; i > 0; i--) {
            const int j = rand_r(&seed) % (i + 1), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        // A rank comes last: rank 0 ends once every rank is served, and a silent client that
        // connected after that would find no listener.
        for (int i = 0; order[EVENTS - 1] == SILENT; i++)
            if (order[i] != SILENT) order[EVENTS - 1] = order[i], order[i] = SILENT;
        FILE *log = tmpfile();
        const int port = free_port();
        const double t0 = now_seconds();
        rank_start(&r[0], port, 0, WORLD, TOKEN, 10, log);
        for (int i = 0; i < EVENTS; i++) {
            if (order[i] == SILENT)
                silent[n_silent++] = stray_open(port);
            else
                rank_start(&r[order[i]], port, order[i], WORLD, TOKEN, 10, NULL);
            sleep_s(0.02);
        }
        int all = 1;
        for (int i = 0; i < WORLD; i++)
            rank_join(&r[i]);
        for (int i = 1; i < WORLD; i++)
            all &= got_id(&r[i]);
        EXPECT(r[0].rc == 0 && all && r[0].done_at - t0 < UNBLOCKED_S,
               "round %d: 7 ranks served in %.2f s beside 2 silent clients: %s", round,
               r[0].done_at - t0, r[0].err);
        for (int i = 0; i < 2; i++)
            EXPECT(silent[i].fd >= 0 && stray_got_nothing(&silent[i], 1) &&
                       log_names(log, silent[i].port, "the bootstrap ended") == 1,
                   "round %d: silent client %d got nothing and is logged once", round, i);
        EXPECT(log_count(log, NULL) == 2, "round %d: two lines in all", round);
        for (int i = 0; i < 2; i++)
            stray_close(&silent[i]);
        fclose(log);
    }
}

// The launch-level wrapper: port MASTER_PORT + 1 and the launch's job token.
static void test_launch_wrapper(void) {
    LaunchInfo li0 = {.kind = LAUNCH_TORCHRUN, .rank = 0, .world = 2};
    li0.master_port = free_port() - 1;  // the bootstrap takes MASTER_PORT + 1
    snprintf(li0.master_addr, sizeof li0.master_addr, "127.0.0.1");
    snprintf(li0.job_token, sizeof li0.job_token, TOKEN);
    Rank r1;
    rank_start(&r1, li0.master_port + 1, 1, 2, TOKEN, 10, NULL);
    unsigned char id[ID_BYTES];
    for (int i = 0; i < ID_BYTES; i++)
        id[i] = id_byte(i);
    char err[512] = "";
    EXPECT(comm_tcp_bootstrap(&li0, id, ID_BYTES, 10, err, sizeof err) == 0, "rank 0: %s", err);
    rank_join(&r1);
    EXPECT(got_id(&r1), "rank 1 reached rank 0 on MASTER_PORT + 1 with the job token: %s", r1.err);
    LaunchInfo none = {.kind = LAUNCH_TORCHRUN, .rank = 1, .world = 2};
    EXPECT(comm_tcp_bootstrap(&none, id, ID_BYTES, 1, err, sizeof err) != 0 &&
               strstr(err, "needs MASTER_ADDR and MASTER_PORT"),
           "without MASTER_ADDR: %s", err);
}

// The warning without a token: rank 0 only, only when other hosts can reach the port.
static void test_token_warning(void) {
    const char *loopback[] = {"127.0.0.1", "localhost", "127.3.2.1", "::1"};
    const char *network[] = {"10.1.2.3", "node7", "::ffff:10.0.0.1", "fe80::1"};
    LaunchInfo li = {.kind = LAUNCH_SLURM, .rank = 0, .world = 16, .master_port = 29500};
    char msg[512];
    for (size_t i = 0; i < 4; i++) {
        EXPECT(tcp_addr_is_loopback(loopback[i]) == 1, "%s is loopback", loopback[i]);
        EXPECT(tcp_addr_is_loopback(network[i]) == 0, "%s is not loopback", network[i]);
        snprintf(li.master_addr, sizeof li.master_addr, "%s", loopback[i]);
        EXPECT(comm_tcp_token_warning(&li, msg, sizeof msg) == 0, "no warning on %s", loopback[i]);
        snprintf(li.master_addr, sizeof li.master_addr, "%s", network[i]);
        msg[0] = '\0';
        EXPECT(comm_tcp_token_warning(&li, msg, sizeof msg) == 1 &&
                   strstr(msg, "FLASHGPT_JOB_TOKEN") && strstr(msg, "port 29501"),
               "a warning on %s: %s", network[i], msg);
    }
    li.rank = 3;
    EXPECT(comm_tcp_token_warning(&li, msg, sizeof msg) == 0, "rank 0 alone warns");
    li.rank = 0;
    snprintf(li.job_token, sizeof li.job_token, "4242.0");
    EXPECT(comm_tcp_token_warning(&li, msg, sizeof msg) == 0, "no warning with a token");
}

int main(void) {
    TEST_CASE("every rank arrives, some before rank 0 listens", test_all_arrive());
    TEST_CASE("a missing rank, a missing rank 0", test_missing());
    TEST_CASE("a silent client holds nothing but itself, until its deadline", test_silent());
    TEST_CASE("impostors without the token take no rank's place", test_impostor());
    TEST_CASE("a duplicate rank and a rank outside the world are refused", test_duplicate());
    TEST_CASE("garbage senders are dropped", test_garbage());
    TEST_CASE("8 ranks in random orders with 2 silent clients", test_random_order());
    TEST_CASE("comm_tcp_bootstrap: MASTER_PORT + 1 and the job token", test_launch_wrapper());
    TEST_CASE("the warning without a job token", test_token_warning());
    return TEST_SUMMARY();
}
