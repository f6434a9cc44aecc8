/*
 * The sandbox ("pause") process of swiftlet's local pause image: it holds the pod's namespaces
 * open and does nothing else, like Kubernetes' build/pause/linux/pause.c.
 *
 * - SIGINT/SIGTERM end it with status 0: stopping a sandbox is not a failure.
 * - SIGCHLD reaps every exited child: when the pod shares its PID namespace, this is the
 *   namespace's init and inherits orphans, which would otherwise stay zombies.
 * - Otherwise it sleeps in pause() forever.
 *
 * Built by `cargo xtask` with `gcc -static -Os` so the image needs no libc.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo) {
    (void)signo;
    _exit(0);
}

static void reap(int signo) {
    (void)signo;
    /* Several children may have exited for one delivered SIGCHLD. */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "-v") == 0) {
        printf("swiftlet pause\n");
        return 0;
    }
    if (getpid() != 1) {
        /* Not an error: useful when run by hand, but it reaps only its own children then. */
        fprintf(stderr, "pause: warning: not running as PID 1\n");
    }

    struct sigaction on_stop;
    memset(&on_stop, 0, sizeof(on_stop));
    on_stop.sa_handler = stop;
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0) {
        perror("pause: sigaction");
        return 1;
    }

    struct sigaction on_child;
    memset(&on_child, 0, sizeof(on_child));
    on_child.sa_handler = reap;
    /* SA_NOCLDSTOP: a stopped child is not a dead one; SA_RESTART keeps pause() simple. */
    on_child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    if (sigaction(SIGCHLD, &on_child, NULL) < 0) {
        perror("pause: sigaction");
        return 1;
    }

    for (;;) {
        pause();
    }
    /* Not reached. */
    return 42;
}
