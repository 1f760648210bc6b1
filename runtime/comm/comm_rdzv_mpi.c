/* comm_rdzv_mpi.c - a torchrun-style launch joined into one MPI world.
 *
 * torchrun (or any launcher that only sets RANK, WORLD_SIZE, MASTER_ADDR and
 * MASTER_PORT) starts processes that no MPI runtime knows of: MPI_Init
 * makes each a world of one.  Open MPI 4 joins separately started processes
 * (MPI_Comm_connect / MPI_Comm_accept) only through an ompi-server whose URI
 * every one of them has before MPI_Init (OMPI_MCA_pmix_server_uri).  So the
 * launch takes three steps over one TCP connection from every rank to rank 0
 * at MASTER_ADDR, on the rendezvous port (moe_comm_launch.rdzv_port):
 *   1. each rank says who it is ("moerun-rdzv LAYOUT RANK SIZE"); rank 0
 *      waits for all of them, refusing a rank twice or another world size;
 *   2. rank 0 starts ompi-server (unless the user runs one and set its URI)
 *      and sends every rank its URI; all call MPI_Init;
 *   3. rank 0 opens an MPI port and sends its name to ranks 1, 2, ... in
 *      turn: the ranks joined so far accept the next one together, it
 *      connects, and both sides merge, so the world grows in RANK order.
 * Only those lines travel over TCP; every collective after is MPI's.  Each
 * step is bounded by the communicator's timeout; MPI_Comm_accept and
 * MPI_Comm_connect have none of their own, so an alarm bounds step 3 (a
 * rank dying between its TCP line and its connect: the others end with one
 * line rather than wait).  The connections stay open
 * for the job's life: a follower waiting idle for rank 0's next step sees
 * rank 0's end close when rank 0 dies, where no mpirun would tell it
 * (moe_comm_rdzv_orphaned). */
#include "runtime/comm/comm_impl.h"
#include "runtime/core/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What every rank's first line starts with; the number changes when the
 * steps above change, so ranks of different moerun versions refuse to join. */
#define RDZV_HELLO "moerun-rdzv 1"
#define LINE_MAX_BYTES 4096

static int ms_left(double deadline)
{
    const double left = deadline - moe_seconds();
    return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

static enum moe_status write_line(int fd, const char *line, const char *to)
{
    size_t n = strlen(line), done = 0;
    while (done < n) {
        ssize_t w = send(fd, line + done, n - done, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return moe_fail(MOE_ERR_IO, "launch: sending to %s: %s", to, strerror(errno));
        done += (size_t)w;
    }
    return MOE_OK;
}

/* One line from fd (without its newline) into buf (LINE_MAX_BYTES), by the
 * deadline; byte by byte, so nothing after the line is consumed. */
static enum moe_status read_line(int fd, char *buf, double deadline, const char *from)
{
    size_t n = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, ms_left(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r == 0)
            return moe_fail(MOE_ERR_IO, "launch: no word from %s within the timeout", from);
        char ch;
        ssize_t got = recv(fd, &ch, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return moe_fail(MOE_ERR_IO, "launch: %s closed the rendezvous connection", from);
        if (ch == '\n') break;
        if (n + 1 >= LINE_MAX_BYTES) return moe_fail(MOE_ERR_IO, "launch: an overlong line from %s", from);
        buf[n++] = ch;
    }
    buf[n] = 0;
    if (!strncmp(buf, "error ", 6)) return moe_fail(MOE_ERR_IO, "launch: %s says: %s", from, buf + 6);
    return MOE_OK;
}

/* Rank 0: a socket listening on the rendezvous port on every address. */
static enum moe_status listen_on(int port, int *out)
{
    *out = -1;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_flags = AI_PASSIVE, .ai_family = AF_INET6, .ai_socktype = SOCK_STREAM}, *ai;
    int fd = -1, err = 0;
    for (int family = 0; family < 2 && fd < 0; family++) { /* IPv6 (both stacks), else IPv4 */
        hints.ai_family = family == 0 ? AF_INET6 : AF_INET;
        if (getaddrinfo(NULL, service, &hints, &ai)) continue;
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1, zero = 0;
        if (fd >= 0) {
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (family == 0) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128)) {
                err = errno;
                close(fd);
                fd = -1;
            }
        }
        freeaddrinfo(ai);
    }
    if (fd < 0)
        return moe_fail(MOE_ERR_IO, "launch: rank 0 cannot listen on rendezvous port %d: %s%s", port,
                        strerror(err), err == EADDRINUSE ? " (another job's, or torchrun's own store: set "
                        "MOERUN_RDZV_PORT to a free port)" : "");
    *out = fd;
    return MOE_OK;
}

/* Whether fd is connected to itself: a connect to a local port nobody
 * listens on can be given that port as its own and meet itself (TCP's
 * simultaneous open), which would then hold rank 0's port. */
static bool self_connected(int fd)
{
    struct sockaddr_storage a, b;
    socklen_t la = sizeof a, lb = sizeof b;
    return !getsockname(fd, (struct sockaddr *)&a, &la) && !getpeername(fd, (struct sockaddr *)&b, &lb) &&
           la == lb && !memcmp(&a, &b, la);
}

/* Ranks > 0: a connection to rank 0, retried until the deadline (rank 0
 * may not be listening yet). */
static enum moe_status connect_to(const char *addr, int port, double deadline, int *out)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gai = getaddrinfo(addr, service, &hints, &ai);
    if (gai)
        return moe_fail(MOE_ERR_IO, "launch: MASTER_ADDR=%s: %s", addr, gai_strerror(gai));
    int err = 0;
    for (;;) {
        for (struct addrinfo *a = ai; a; a = a->ai_next) {
            int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0) continue;
            const int rc = connect(fd, a->ai_addr, a->ai_addrlen);
            if (rc == 0 && !self_connected(fd)) {
                freeaddrinfo(ai);
                *out = fd;
                return MOE_OK;
            }
            err = rc ? errno : ECONNREFUSED;
            close(fd);
        }
        if (moe_seconds() >= deadline) break;
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    freeaddrinfo(ai);
    return moe_fail(MOE_ERR_IO, "launch: cannot reach rank 0 at %s:%d within the timeout: %s", addr, port,
                    strerror(err));
}

/* Rank 0: every other rank's connection, in RANK order, into fds (size). */
static enum moe_status gather_ranks(struct moe_comm *c, int lfd, const struct moe_comm_launch *l,
                                    double deadline)
{
    for (int joined = 1; joined < l->size;) {
        struct pollfd p = {lfd, POLLIN, 0};
        int r = poll(&p, 1, ms_left(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            int missing = 1;
            while (missing < l->size && c->rdzv_fds[missing] >= 0) missing++;
            return moe_fail(MOE_ERR_IO, "launch: %d of %d ranks reached rank 0 within %g s (rank %d did not)",
                            joined, l->size, c->timeout_s, missing);
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        char line[LINE_MAX_BYTES];
        int rank = -1, size = -1, used = 0;
        if (read_line(fd, line, deadline, "a rank") != MOE_OK ||
            sscanf(line, RDZV_HELLO " %d %d%n", &rank, &size, &used) != 2 || line[used]) {
            (void)write_line(fd, "error not a moerun rank of this version (" RDZV_HELLO ")\n", "a rank");
            close(fd); /* a stray connection: not a failure of the launch */
            continue;
        }
        const char *why = size != l->size ? "another world size" :
                          rank < 1 || rank >= l->size ? "a rank outside the world" :
                          c->rdzv_fds[rank] >= 0 ? "a rank already joined" : NULL;
        if (why) {
            char msg[128];
            snprintf(msg, sizeof msg, "error rank %d of %d is %s (rank 0: WORLD_SIZE=%d)\n", rank, size, why,
                     l->size);
            (void)write_line(fd, msg, "a rank");
            close(fd);
            return moe_fail(MOE_ERR_INVALID_ARG, "launch: %.*s", (int)strlen(msg) - 7, msg + 6);
        }
        c->rdzv_fds[rank] = fd;
        joined++;
    }
    return MOE_OK;
}

/* Rank 0: ompi-server started in a fresh folder; *uri its URI (uri_cap). */
static enum moe_status start_server(struct moe_comm *c, char *uri, size_t uri_cap, double deadline)
{
    char dir[] = "/tmp/moerun-rdzv-XXXXXX", file[64];
    if (!mkdtemp(dir)) return moe_fail(MOE_ERR_IO, "launch: a folder for ompi-server's URI: %s", strerror(errno));
    snprintf(file, sizeof file, "%s/uri", dir);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* it ends with rank 0, however rank 0 ends */
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, STDOUT_FILENO);
        execlp("ompi-server", "ompi-server", "--no-daemonize", "-r", file, (char *)NULL);
        fprintf(stderr, "moerun: launch: cannot start ompi-server (Open MPI's, package openmpi-bin): %s\n",
                strerror(errno));
        _exit(127);
    }
    enum moe_status s = MOE_OK;
    if (pid < 0) s = moe_fail(MOE_ERR_IO, "launch: starting ompi-server: %s", strerror(errno));
    c->rdzv_server = pid > 0 ? pid : 0;
    uri[0] = 0;
    while (s == MOE_OK) {
        FILE *f = fopen(file, "r");
        if (f) {
            bool got = fgets(uri, (int)uri_cap, f) && strchr(uri, '\n');
            fclose(f);
            if (got) {
                uri[strcspn(uri, "\n")] = 0;
                break;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            c->rdzv_server = 0;
            s = moe_fail(MOE_ERR_IO, "launch: ompi-server ended (status %d) before giving its URI (its message "
                         "is above)", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        } else if (moe_seconds() >= deadline) {
            s = moe_fail(MOE_ERR_IO, "launch: ompi-server gave no URI within the timeout");
        } else {
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
        }
    }
    unlink(file);
    rmdir(dir);
    return s;
}

/* Step 3's bound: MPI_Comm_accept / MPI_Comm_connect cannot be given a
 * timeout, so a SIGALRM at the deadline ends the process with one line
 * (async-signal-safe: write and _exit only). */
static char alarm_msg[160];

static void on_alarm(int sig)
{
    (void)sig;
    ssize_t w = write(STDERR_FILENO, alarm_msg, strlen(alarm_msg));
    (void)w;
    _exit(1);
}

static void arm_alarm(const struct moe_comm_launch *l, double deadline, struct sigaction *old)
{
    snprintf(alarm_msg, sizeof alarm_msg, "moerun: rank %d: launch: the ranks did not all join MPI's world "
             "within the timeout (a rank died or hangs); ending\n", l->rank);
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, old);
    const int ms = ms_left(deadline);
    alarm(ms > 0 ? (unsigned)((ms + 999) / 1000) : 1);
}

static void disarm_alarm(const struct sigaction *old)
{
    alarm(0);
    sigaction(SIGALRM, old, NULL);
}

/* Step 3: the world grown from MPI_COMM_SELF, one rank at a time. */
static enum moe_status grow_world(struct moe_comm *c, const struct moe_comm_launch *l, double deadline)
{
    char port[MPI_MAX_PORT_NAME] = "", line[LINE_MAX_BYTES];
    MPI_Comm world = MPI_COMM_SELF;
    if (l->rank == 0) {
        if (MPI_Open_port(MPI_INFO_NULL, port) != MPI_SUCCESS)
            return moe_fail(MOE_ERR_IO, "launch: rank 0 cannot open an MPI port");
    } else {
        MOE_TRY(read_line(c->rdzv_fd, line, deadline, "rank 0"));
        if (strncmp(line, "port ", 5)) return moe_fail(MOE_ERR_IO, "launch: rank 0 sent \"%s\"", line);
        MPI_Comm ic;
        if (MPI_Comm_connect(line + 5, MPI_INFO_NULL, 0, MPI_COMM_SELF, &ic) != MPI_SUCCESS ||
            MPI_Intercomm_merge(ic, 1, &world) != MPI_SUCCESS)
            return moe_fail(MOE_ERR_IO, "launch: rank %d cannot join the ranks before it", l->rank);
        MPI_Comm_free(&ic);
    }
    for (int next = l->rank + 1; next < l->size; next++) {
        if (l->rank == 0) {
            snprintf(line, sizeof line, "port %s\n", port);
            MOE_TRY(write_line(c->rdzv_fds[next], line, "a rank"));
        }
        MPI_Comm ic, grown;
        if (MPI_Comm_accept(port, MPI_INFO_NULL, 0, world, &ic) != MPI_SUCCESS ||
            MPI_Intercomm_merge(ic, 0, &grown) != MPI_SUCCESS)
            return moe_fail(MOE_ERR_IO, "launch: rank %d cannot take rank %d in", l->rank, next);
        MPI_Comm_free(&ic);
        if (world != MPI_COMM_SELF) MPI_Comm_free(&world);
        world = grown;
    }
    if (l->rank == 0) MPI_Close_port(port);
    c->world = world;
    return MOE_OK;
}

/* Rank 0, steps 1 and 2. */
static enum moe_status lead(struct moe_comm *c, const struct moe_comm_launch *l, double deadline)
{
    int lfd;
    MOE_TRY(listen_on(l->rdzv_port, &lfd));
    enum moe_status s = gather_ranks(c, lfd, l, deadline);
    close(lfd);
    MOE_TRY(s);
    char uri[LINE_MAX_BYTES], line[LINE_MAX_BYTES + 8];
    if (l->pmix_uri[0]) {
        snprintf(uri, sizeof uri, "%s", l->pmix_uri);
    } else {
        MOE_TRY(start_server(c, uri, sizeof uri, deadline));
        setenv("OMPI_MCA_pmix_server_uri", uri, 1);
    }
    snprintf(line, sizeof line, "uri %s\n", uri);
    for (int r = 1; r < l->size; r++) MOE_TRY(write_line(c->rdzv_fds[r], line, "a rank"));
    return MOE_OK;
}

enum moe_status moe_comm_rdzv_open(struct moe_comm *c, const struct moe_comm_launch *l)
{
    if (!l->master_addr[0] || l->rdzv_port <= 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "launch: a torchrun-style launch (RANK=%d WORLD_SIZE=%d) needs "
                        "MASTER_ADDR and MASTER_PORT: where rank 0 waits for the others", l->rank, l->size);
    const double deadline = moe_seconds() + c->timeout_s;
    char line[LINE_MAX_BYTES];
    c->rdzv = true;
    c->rdzv_fd = -1;
    if (l->rank == 0) {
        c->rdzv_fds = malloc((size_t)l->size * sizeof *c->rdzv_fds);
        if (!c->rdzv_fds) return moe_fail(MOE_ERR_NOMEM, "launch");
        for (int r = 0; r < l->size; r++) c->rdzv_fds[r] = -1;
        enum moe_status s = lead(c, l, deadline);
        if (s != MOE_OK) { /* the ranks that came hear why, rather than a closed connection */
            snprintf(line, sizeof line, "error %.2000s\n", moe_last_error());
            for (int r = 1; r < l->size; r++)
                if (c->rdzv_fds[r] >= 0) (void)write_line(c->rdzv_fds[r], line, "a rank");
            return s;
        }
    } else {
        MOE_TRY(connect_to(l->master_addr, l->rdzv_port, deadline, &c->rdzv_fd));
        snprintf(line, sizeof line, RDZV_HELLO " %d %d\n", l->rank, l->size);
        MOE_TRY(write_line(c->rdzv_fd, line, "rank 0"));
        MOE_TRY(read_line(c->rdzv_fd, line, deadline, "rank 0"));
        if (strncmp(line, "uri ", 4)) return moe_fail(MOE_ERR_IO, "launch: rank 0 sent \"%s\"", line);
        setenv("OMPI_MCA_pmix_server_uri", line + 4, 1);
    }
    MOE_TRY(moe_comm_mpi_init(c, l));
    struct sigaction old;
    arm_alarm(l, deadline, &old);
    enum moe_status grown = grow_world(c, l, deadline);
    disarm_alarm(&old);
    MOE_TRY(grown);
    c->group = c->world;
    int rank = -1, size = -1;
    MPI_Comm_rank(c->world, &rank);
    MPI_Comm_size(c->world, &size);
    if (rank != l->rank || size != l->size)
        return moe_fail(MOE_ERR_IO, "launch: joined as rank %d of %d, not %d of %d", rank, size, l->rank, l->size);
    return MOE_OK;
}

bool moe_comm_rdzv_orphaned(struct moe_comm *c)
{
    if (c->rdzv_fd < 0) return false;
    struct pollfd p = {c->rdzv_fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    char ch;
    return recv(c->rdzv_fd, &ch, 1, MSG_DONTWAIT) == 0 || (p.revents & (POLLHUP | POLLERR));
}

void moe_comm_rdzv_close(struct moe_comm *c)
{
    if (c->rdzv_fd >= 0) close(c->rdzv_fd);
    c->rdzv_fd = -1;
    if (c->rdzv_fds)
        for (int r = 0; r < c->size; r++)
            if (c->rdzv_fds[r] >= 0) close(c->rdzv_fds[r]);
    free(c->rdzv_fds);
    c->rdzv_fds = NULL;
    if (c->rdzv_server > 0) {
        kill(c->rdzv_server, SIGTERM);
        waitpid(c->rdzv_server, NULL, 0);
        c->rdzv_server = 0;
    }
}
