/*
 * fastcrit-jail: set up the isolation of one sandbox worker, then exec it.
 *
 *   fastcrit-jail [--uid N] [--scratch DIR] [--scratch-mb N] [--expose PATH]... [--probe] -- PROGRAM ARGS...
 *
 * Steps, in order (each one is recorded; --probe prints the record as JSON and exits):
 *   1. new namespaces: network (no interfaces but a downed loopback), mount, PID, IPC, UTS.
 *      As root they are created directly; otherwise inside a new user namespace that maps the
 *      caller's uid/gid to 1000.
 *   2. fork: the child is PID 1 of the new PID namespace. PID 1 ignores signals sent from inside
 *      its namespace, so sandboxed code cannot kill its worker; when PID 1 exits the kernel kills
 *      every process left in the namespace. The parent waits and forwards the exit status; if the
 *      parent dies, PR_SET_PDEATHSIG kills the child (and so the whole namespace).
 *   3. mounts: everything private; paths given with --expose made reachable for the dropped uid
 *      (see expose()); the whole tree read-only (mount_setattr AT_RECURSIVE), then a
 *      fresh tmpfs on the scratch directory, limited in size and in files (64 per MiB), and a
 *      fresh /proc that shows only this namespace's processes. The tmpfs holds one directory,
 *      home/, owned by the worker's uid and bind-mounted on itself, then the tmpfs root is made
 *      read-only: home/ is the only writable place, and as a mount point it cannot be removed,
 *      renamed or replaced; the root beside it cannot be changed at all (the worker empties and
 *      resets home/ after each execution; see workers.Scratch).
 *   4. privileges: as root, drop to the unprivileged uid/gid given by --uid (no supplementary
 *      groups); with a distinct uid per worker, RLIMIT_NPROC is enforced per worker.
 *      PR_SET_NO_NEW_PRIVS always.
 *   5. seccomp (raw BPF, no libseccomp): refuse socket(), process tracing (ptrace,
 *      process_vm_readv/writev), io_uring, bpf, perf_event_open, keyrings, mount/namespace changes,
 *      module loading, kexec; clone() with namespace flags; clone3 answers ENOSYS so libc falls back
 *      to clone(). SysV IPC objects and POSIX message queues are refused: they live in the worker's
 *      IPC namespace, so they would outlive the execution that made them and reach the next one.
 *      Syscalls of a foreign architecture (x86 32-bit, x32) are refused too.
 *   6. exec PROGRAM.
 * Exit status 111 means a required step failed; the message on stderr names it.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/mount.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__)
#define JAIL_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define JAIL_ARCH AUDIT_ARCH_AARCH64
#else
#error "fastcrit-jail: unsupported architecture (x86_64 and aarch64 only)"
#endif

#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x00000001
#define MOUNT_ATTR_NOSUID 0x00000002
#define MOUNT_ATTR_NODEV 0x00000004
struct mount_attr {
    uint64_t attr_set;
    uint64_t attr_clr;
    uint64_t propagation;
    uint64_t userns_fd;
};
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

#define EXIT_JAIL 111
#define NS_FLAGS (CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWCGROUP)

static struct {
    int root, userns, netns, mntns, pidns, rofs, scratch, proc, uid_drop, nnp, seccomp;
} rec;

static void die(const char *what) {
    fprintf(stderr, "fastcrit-jail: %s failed: %s\n", what, strerror(errno));
    _exit(EXIT_JAIL);
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* One BPF program: arch check, then a list of refused syscalls, then allow. */
static int install_seccomp(void) {
#define DENY(nr, err) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), \
                      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((err) & SECCOMP_RET_DATA))
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, JAIL_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#if defined(__x86_64__)
        /* x32 ABI syscalls carry bit 30; refuse them all. */
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
#endif
        /* clone(): refuse namespace creation (flags are argument 0 on both arches). */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NS_FLAGS, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        DENY(__NR_clone3, ENOSYS),
        DENY(__NR_socket, EPERM),
        DENY(__NR_ptrace, EPERM),
        DENY(__NR_process_vm_readv, EPERM),
        DENY(__NR_process_vm_writev, EPERM),
        DENY(__NR_io_uring_setup, EPERM),
        DENY(__NR_io_uring_enter, EPERM),
        DENY(__NR_io_uring_register, EPERM),
        DENY(__NR_bpf, EPERM),
        DENY(__NR_perf_event_open, EPERM),
        DENY(__NR_userfaultfd, EPERM),
        DENY(__NR_keyctl, EPERM),
        DENY(__NR_add_key, EPERM),
        DENY(__NR_request_key, EPERM),
        DENY(__NR_mount, EPERM),
        DENY(__NR_umount2, EPERM),
        DENY(__NR_pivot_root, EPERM),
        DENY(__NR_chroot, EPERM),
        DENY(__NR_unshare, EPERM),
        DENY(__NR_setns, EPERM),
        DENY(__NR_init_module, EPERM),
        DENY(__NR_finit_module, EPERM),
        DENY(__NR_delete_module, EPERM),
        DENY(__NR_kexec_load, EPERM),
        DENY(__NR_open_by_handle_at, EPERM),
        DENY(__NR_name_to_handle_at, EPERM),
        DENY(__NR_mount_setattr, EPERM),
        DENY(__NR_fsopen, EPERM),
        DENY(__NR_fsmount, EPERM),
        DENY(__NR_move_mount, EPERM),
        DENY(__NR_open_tree, EPERM),
        DENY(__NR_shmget, EPERM),
        DENY(__NR_semget, EPERM),
        DENY(__NR_msgget, EPERM),
        DENY(__NR_mq_open, EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
#undef DENY
    struct sock_fprog prog = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
}

/*
 * Make PATH reachable for the unprivileged uid. The first ancestor D that "others" cannot search
 * (e.g. /root, mode 0700, holding a pyenv interpreter) is covered by an empty tmpfs (mode 0755)
 * and only D's child on the way to PATH is bind-mounted back from the original D, reached through
 * a file descriptor opened before the cover. Everything else under D stays hidden.
 */
#define MAX_COVERS 16
static struct { char dir[4096]; int fd; } covers[MAX_COVERS];
static int n_covers;

static int expose(const char *path) {
    for (int round = 0; round < 32; round++) {
        char buf[4096], *p;
        struct stat st;
        if (strlen(path) >= sizeof buf || path[0] != '/') { errno = EINVAL; return -1; }
        strcpy(buf, path);
        const char *blocked = NULL, *child = NULL;
        for (p = buf + 1;; p++) {
            if (*p != '/' && *p != 0) continue;
            char save = *p;
            *p = 0;
            /* buf is now a prefix; check its parent's search bit through the prefix itself */
            char *slash = strrchr(buf, '/');
            char parent[4096];
            size_t plen = slash == buf ? 1 : (size_t)(slash - buf);
            memcpy(parent, buf, plen);
            parent[plen] = 0;
            if (stat(parent, &st) != 0) return -1;
            if (S_ISDIR(st.st_mode) && !(st.st_mode & S_IXOTH)) {
                static char pb[4096], cb[4096];
                strcpy(pb, parent);
                strcpy(cb, slash + 1);
                blocked = pb;
                child = cb;
                *p = save;
                break;
            }
            *p = save;
            if (save == 0) break;
        }
        if (!blocked) return 0;
        int k;
        for (k = 0; k < n_covers; k++)
            if (!strcmp(covers[k].dir, blocked)) break;
        if (k == n_covers) {
            if (n_covers == MAX_COVERS) { errno = ENOSPC; return -1; }
            int fd = open(blocked, O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (fd < 0) return -1;
            if (mount("fastcrit-cover", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") != 0) return -1;
            strcpy(covers[k].dir, blocked);
            covers[k].fd = fd;
            n_covers++;
        }
        char src[4200], dst[8200];
        snprintf(src, sizeof src, "/proc/self/fd/%d/%s", covers[k].fd, child);
        snprintf(dst, sizeof dst, "%s/%s", strcmp(blocked, "/") ? blocked : "", child);
        if (stat(src, &st) != 0) return -1;
        if (S_ISDIR(st.st_mode)) {
            if (mkdir(dst, 0755) != 0 && errno != EEXIST) return -1;
        } else {
            int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
            if (fd < 0) return -1;
            close(fd);
        }
        if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) != 0) return -1;
    }
    errno = ELOOP;
    return -1;
}

static void print_record(void) {
    printf("{\"root\": %d, \"userns\": %d, \"netns\": %d, \"mntns\": %d, \"pidns\": %d, "
           "\"rofs\": %d, \"scratch_tmpfs\": %d, \"proc\": %d, \"uid_drop\": %d, "
           "\"no_new_privs\": %d, \"seccomp\": %d}\n",
           rec.root, rec.userns, rec.netns, rec.mntns, rec.pidns, rec.rofs, rec.scratch, rec.proc,
           rec.uid_drop, rec.nnp, rec.seccomp);
    fflush(stdout);
}

static void usage(void) {
    fprintf(stderr, "usage: fastcrit-jail [--uid N] [--scratch DIR] [--scratch-mb N] [--expose PATH]... [--probe] -- PROGRAM ARGS...\n");
    _exit(2);
}

int main(int argc, char **argv) {
    long uid = 61000, scratch_mb = 256;
    const char *scratch = NULL;
    int probe = 0, i, n_expose = 0;
    const char *exposes[64];
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        else if (!strcmp(argv[i], "--probe")) probe = 1;
        else if (!strcmp(argv[i], "--uid") && i + 1 < argc) uid = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--scratch") && i + 1 < argc) scratch = argv[++i];
        else if (!strcmp(argv[i], "--expose") && i + 1 < argc && n_expose < 64) exposes[n_expose++] = argv[++i];
        else if (!strcmp(argv[i], "--scratch-mb") && i + 1 < argc) scratch_mb = strtol(argv[++i], NULL, 10);
        else usage();
    }
    if (!probe && i >= argc) usage();
    if (uid <= 0 || uid > 0x7ffffffe || scratch_mb <= 0) usage();

    uid_t outer_uid = getuid();
    gid_t outer_gid = getgid();
    rec.root = geteuid() == 0;
    int flags = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS;
    if (!rec.root) flags |= CLONE_NEWUSER;
    if (unshare(flags) != 0) die("unshare(net, mount, pid, ipc, uts)");
    rec.netns = rec.mntns = rec.pidns = 1;
    if (!rec.root) {
        char map[64];
        rec.userns = 1;
        write_file("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "1000 %u 1\n", (unsigned)outer_uid);
        if (write_file("/proc/self/uid_map", map) != 0) die("writing uid_map");
        snprintf(map, sizeof map, "1000 %u 1\n", (unsigned)outer_gid);
        if (write_file("/proc/self/gid_map", map) != 0) die("writing gid_map");
    }

    pid_t child = fork();
    if (child < 0) die("fork");
    if (child > 0) {
        /* Outside the PID namespace: wait, forward the status, never run anything else. */
        int st;
        signal(SIGINT, SIG_IGN);
        while (waitpid(child, &st, 0) < 0)
            if (errno != EINTR) die("waitpid");
        if (WIFEXITED(st)) return WEXITSTATUS(st);
        return 128 + WTERMSIG(st);
    }

    /* PID 1 of the new namespace from here on. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) die("prctl(PR_SET_PDEATHSIG)");

    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die("mount(/, private)");
    if (rec.root)  /* the dropped uid must still reach the interpreter and the worker's code */
        for (int k = 0; k < n_expose; k++)
            if (expose(exposes[k]) != 0) {
                fprintf(stderr, "fastcrit-jail: exposing %s failed: %s\n", exposes[k], strerror(errno));
                _exit(EXIT_JAIL);
            }
    for (int k = 0; k < n_covers; k++) close(covers[k].fd);
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID};
    if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &attr, sizeof attr) == 0) rec.rofs = 1;
    else fprintf(stderr, "fastcrit-jail: WARNING read-only view unavailable: %s\n", strerror(errno));

    uid_t inner = rec.root ? (uid_t)uid : 1000;
    if (scratch) {
        /* Files are limited as well as bytes: empty files and directories take no blocks, but
         * each costs kernel memory and time to remove. noatime: reading leaves the times of
         * home/ alone, so the worker resets them only after a program changed them. */
        char opts[160], home[4200];
        snprintf(opts, sizeof opts, "size=%ldm,nr_inodes=%ld,mode=0700,uid=%u,gid=%u", scratch_mb,
                 scratch_mb * 64 + 16, (unsigned)inner, (unsigned)inner);
        if (mount("fastcrit-scratch", scratch, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOATIME, opts) != 0)
            die("mount(tmpfs on the scratch directory)");
        snprintf(home, sizeof home, "%s/home", scratch);
        if (mkdir(home, 0700) != 0) die("mkdir(scratch/home)");
        if (chown(home, inner, inner) != 0) die("chown(scratch/home)");
        if (mount(home, home, NULL, MS_BIND, NULL) != 0) die("mount(bind scratch/home)");
        if (mount(NULL, scratch, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOATIME, NULL) != 0)
            die("mount(scratch root read-only)");
        rec.scratch = 1;
    }
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0) rec.proc = 1;
    else fprintf(stderr, "fastcrit-jail: WARNING fresh /proc unavailable: %s\n", strerror(errno));
    sethostname("sandbox", 7);

    if (rec.root) {
        if (setgroups(0, NULL) != 0) die("setgroups");
        if (setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid) != 0) die("setresgid");
        if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) die("setresuid");
        if (setuid(0) == 0) { errno = EPERM; die("dropping root (setuid(0) still works)"); }
    }
    rec.uid_drop = getuid() != 0 && geteuid() != 0;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("prctl(PR_SET_NO_NEW_PRIVS)");
    rec.nnp = 1;
    if (install_seccomp() != 0) die("seccomp filter");
    rec.seccomp = 1;

    if (probe) {
        print_record();
        _exit(0);
    }
    execvp(argv[i], &argv[i]);
    die("exec");
    return EXIT_JAIL;
}
