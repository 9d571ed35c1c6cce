/*
 * fastcrit-jail: set up the isolation of one sandbox worker, then exec it.
 *
 *   fastcrit-jail [--uid N] [--scratch DIR] [--scratch-mb N] [--ro PATH]... [--hide PATH]... [--probe] -- PROGRAM ARGS...
 *
 * Steps, in order (each one is recorded; --probe prints the record as JSON and exits):
 *   1. new namespaces: network (no interfaces but a downed loopback), mount, PID, IPC, UTS.
 *      As root they are created directly; otherwise inside a new user namespace that maps the
 *      caller's uid/gid to 1000.
 *   2. fork: the child is PID 1 of the new PID namespace. PID 1 ignores signals sent from inside
 *      its namespace, so sandboxed code cannot kill its worker; when PID 1 exits the kernel kills
 *      every process left in the namespace. The parent waits and forwards the exit status; if the
 *      parent dies, PR_SET_PDEATHSIG kills the child (and so the whole namespace).
 *   3. mounts: everything private, then a new root: an empty tmpfs holding only the paths given
 *      with --ro (bind-mounted read-only at the same path; a symbolic link is copied) and --hide
 *      (an empty tmpfs, e.g. on a site-packages directory inside an exposed tree, into which later
 *      --ro paths bind allowed packages back), every parent directory created mode 0755; all of it
 *      read-only and nosuid. In it a fresh /proc that shows only this namespace's processes and a
 *      fresh tmpfs on the scratch directory, limited in size and in files (64 per MiB). That tmpfs
 *      holds one directory, home/, owned by the worker's uid and bind-mounted on itself, then the
 *      tmpfs root is made read-only: home/ is the only writable place, and as a mount point it
 *      cannot be removed, renamed or replaced; the root beside it cannot be changed at all (the
 *      worker empties and resets home/ after each execution; see workers.Scratch). Then
 *      pivot_root into the new root with the old one detached: nothing else of the host's files
 *      is reachable.
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
#include <sys/statvfs.h>
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
    int root, userns, netns, mntns, pidns, newroot, rofs, scratch, proc, uid_drop, nnp, seccomp;
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
 * The new root. The set-up first pivots into a small tmpfs of its own (mounted on /tmp, the set-up
 * root) where the old root sits at /oldroot and the new root is assembled at /newroot: every path
 * the new root borrows is taken from /oldroot, so no mount made during the set-up can hide a source
 * (host /tmp included: the set-up root is moved off it by the pivot). Then /oldroot is detached
 * and /newroot becomes "/". Paths are given at their host location and appear at the
 * same location inside, so the interpreter, sys.path and the worker's command line need no change.
 */
#define OLDROOT "/oldroot"
#define NEWROOT "/newroot"

static char *under(const char *root, const char *path) {
    static char buf[2][4200];
    static int k;
    char *b = buf[k++ & 1];
    if (path[0] != '/' || strlen(path) >= 4096) { errno = EINVAL; return NULL; }
    snprintf(b, sizeof buf[0], "%s%s", root, path);
    return b;
}

/* Every missing directory of PATH (PATH included), mode 0755 whatever the umask: the dropped uid
 * must be able to walk to every exposed path (on the host, a parent such as /root may be 0700). A
 * directory that exists is left alone; one that is not a directory is an error. */
static int mkdirs(const char *path) {
    char buf[4200];
    struct stat st;
    if (strlen(path) >= sizeof buf) { errno = ENAMETOOLONG; return -1; }
    strcpy(buf, path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char save = *p;
        *p = 0;
        if (lstat(buf, &st) != 0) {
            if (errno != ENOENT || mkdir(buf, 0755) != 0 || chmod(buf, 0755) != 0) return -1;
        } else if (!S_ISDIR(st.st_mode)) {
            errno = ENOTDIR;
            return -1;
        }
        *p = save;
        if (!save) return 0;
    }
}

static int mkparents(const char *path) {
    char buf[4200];
    strcpy(buf, path);
    char *slash = strrchr(buf, '/');
    if (slash == buf) return 0;
    *slash = 0;
    return mkdirs(buf);
}

/* Make the mount at PATH read-only and nosuid, keeping the flags it had (in a user namespace the
 * kernel refuses a remount that would clear a locked nodev/noexec/atime flag). */
static int remount_ro(const char *path) {
    struct statvfs sv;
    unsigned long fl = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID;
    if (statvfs(path, &sv) != 0) return -1;
    if (sv.f_flag & ST_NODEV) fl |= MS_NODEV;
    if (sv.f_flag & ST_NOEXEC) fl |= MS_NOEXEC;
    if (sv.f_flag & ST_NOATIME) fl |= MS_NOATIME;
    if (sv.f_flag & ST_NODIRATIME) fl |= MS_NODIRATIME;
    if (sv.f_flag & ST_RELATIME) fl |= MS_RELATIME;
    return mount(NULL, path, NULL, fl, NULL);
}

/* --ro PATH: a symbolic link is copied (its target is exposed separately if wanted); anything else
 * is bind-mounted and made read-only at once, before anything can be created under it: a mkdir
 * there would otherwise write to the host. */
static int expose_ro(const char *path) {
    char *src = under(OLDROOT, path), *dst = under(NEWROOT, path);
    struct stat st, dt;
    if (!src || !dst || lstat(src, &st) != 0 || mkparents(dst) != 0) return -1;
    if (S_ISLNK(st.st_mode)) {
        char target[4096];
        ssize_t n = readlink(src, target, sizeof target - 1);
        if (n < 0) return -1;
        target[n] = 0;
        return symlink(target, dst) == 0 || errno == EEXIST ? 0 : -1;
    }
    if (lstat(dst, &dt) != 0) {
        if (S_ISDIR(st.st_mode)) {
            if (mkdir(dst, 0755) != 0 || chmod(dst, 0755) != 0) return -1;
        } else {
            int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            if (fd < 0) return -1;
            close(fd);
        }
    }
    int rec = 0;
    if (mount(src, dst, NULL, MS_BIND, NULL) != 0) {
        /* In a user namespace a tree with locked mounts below it can only be bound whole. */
        if (errno != EINVAL || mount(src, dst, NULL, MS_BIND | MS_REC, NULL) != 0) return -1;
        rec = 1;
    }
    if (remount_ro(dst) != 0) return -1;
    if (rec) {
        struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID};
        if (syscall(SYS_mount_setattr, AT_FDCWD, dst, AT_RECURSIVE, &attr, sizeof attr) != 0) return -1;
    }
    return 0;
}

/* --hide PATH: an empty tmpfs on PATH (a site-packages directory inside an exposed tree, or one the
 * interpreter looks in); later --ro paths under it bind the allowed packages back. It is made
 * read-only with the new root once every path is in place. */
static int hide(const char *path) {
    char *dst = under(NEWROOT, path);
    if (!dst || mkdirs(dst) != 0) return -1;
    return mount("fastcrit-hide", dst, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=1024,mode=0755");
}

static void enter_setup_root(void) {
    if (mount("fastcrit-setup", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=16,mode=0700") != 0)
        die("mount(tmpfs for the set-up root on /tmp)");
    if (chdir("/tmp") != 0) die("chdir(set-up root)");
    if (mkdir("oldroot", 0700) != 0 || mkdir("newroot", 0755) != 0) die("mkdir(set-up root)");
    if (syscall(SYS_pivot_root, ".", "oldroot") != 0) die("pivot_root(set-up root)");
    if (chdir("/") != 0) die("chdir(/)");
    if (mount("fastcrit-root", NEWROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755") != 0)
        die("mount(tmpfs for the new root)");
}

static void enter_new_root(void) {
    if (umount2(OLDROOT, MNT_DETACH) != 0) die("umount(old root)");
    if (chdir(NEWROOT) != 0) die("chdir(new root)");
    /* pivot_root(".", "."): the set-up root ends up mounted over the new one; detach it. */
    if (syscall(SYS_pivot_root, ".", ".") != 0) die("pivot_root(new root)");
    if (umount2(".", MNT_DETACH) != 0) die("umount(set-up root)");
    if (chdir("/") != 0) die("chdir(/)");
}

static void print_record(void) {
    printf("{\"root\": %d, \"userns\": %d, \"netns\": %d, \"mntns\": %d, \"pidns\": %d, "
           "\"newroot\": %d, \"rofs\": %d, \"scratch_tmpfs\": %d, \"proc\": %d, \"uid_drop\": %d, "
           "\"no_new_privs\": %d, \"seccomp\": %d}\n",
           rec.root, rec.userns, rec.netns, rec.mntns, rec.pidns, rec.newroot, rec.rofs, rec.scratch,
           rec.proc, rec.uid_drop, rec.nnp, rec.seccomp);
    fflush(stdout);
}

static void usage(void) {
    fprintf(stderr, "usage: fastcrit-jail [--uid N] [--scratch DIR] [--scratch-mb N] [--ro PATH]... [--hide PATH]... [--probe] -- PROGRAM ARGS...\n");
    _exit(2);
}

int main(int argc, char **argv) {
    long uid = 61000, scratch_mb = 256;
    const char *scratch = NULL;
    int probe = 0, i, n_view = 0;
    /* The new root's paths, in the order given: a path must come after the one it lies under. */
    const char **view = calloc(argc, sizeof *view);
    char *view_kind = calloc(argc, 1);
    if (!view || !view_kind) die("calloc");
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        else if (!strcmp(argv[i], "--probe")) probe = 1;
        else if (!strcmp(argv[i], "--uid") && i + 1 < argc) uid = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--scratch") && i + 1 < argc) scratch = argv[++i];
        else if ((!strcmp(argv[i], "--ro") || !strcmp(argv[i], "--hide")) && i + 1 < argc && argv[i + 1][0] == '/') {
            view_kind[n_view] = argv[i][2];
            view[n_view++] = argv[++i];
        }
        else if (!strcmp(argv[i], "--scratch-mb") && i + 1 < argc) scratch_mb = strtol(argv[++i], NULL, 10);
        else usage();
    }
    if (!probe && i >= argc) usage();
    if (uid <= 0 || uid > 0x7ffffffe || scratch_mb <= 0 || (scratch && scratch[0] != '/')) usage();

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
    enter_setup_root();
    char proc_dir[] = NEWROOT "/proc", scratch_dir[4200];
    if (scratch && strlen(scratch) >= 4096) usage();
    snprintf(scratch_dir, sizeof scratch_dir, NEWROOT "%s", scratch ? scratch : "");
    if (mkdirs(proc_dir) != 0 || (scratch && mkdirs(scratch_dir) != 0)) die("mkdir(mount points in the new root)");
    for (int k = 0; k < n_view; k++)
        if ((view_kind[k] == 'r' ? expose_ro(view[k]) : hide(view[k])) != 0) {
            fprintf(stderr, "fastcrit-jail: %s %s failed: %s\n", view_kind[k] == 'r' ? "exposing" : "hiding",
                    view[k], strerror(errno));
            _exit(EXIT_JAIL);
        }
    for (int k = 0; k < n_view; k++)
        if (view_kind[k] == 'h' && remount_ro(under(NEWROOT, view[k])) != 0) die("mount(hidden directory read-only)");
    if (remount_ro(NEWROOT) != 0) die("mount(new root read-only)");
    rec.rofs = 1;

    uid_t inner = rec.root ? (uid_t)uid : 1000;
    if (scratch) {
        /* Files are limited as well as bytes: empty files and directories take no blocks, but
         * each costs kernel memory and time to remove. noatime: reading leaves the times of
         * home/ alone, so the worker resets them only after a program changed them. */
        char opts[160], home[4300];
        snprintf(opts, sizeof opts, "size=%ldm,nr_inodes=%ld,mode=0700,uid=%u,gid=%u", scratch_mb,
                 scratch_mb * 64 + 16, (unsigned)inner, (unsigned)inner);
        if (mount("fastcrit-scratch", scratch_dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOATIME, opts) != 0)
            die("mount(tmpfs on the scratch directory)");
        snprintf(home, sizeof home, "%s/home", scratch_dir);
        if (mkdir(home, 0700) != 0) die("mkdir(scratch/home)");
        if (chown(home, inner, inner) != 0) die("chown(scratch/home)");
        if (mount(home, home, NULL, MS_BIND, NULL) != 0) die("mount(bind scratch/home)");
        if (mount(NULL, scratch_dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOATIME, NULL) != 0)
            die("mount(scratch root read-only)");
        rec.scratch = 1;
    }
    /* Before the old root goes: in a user namespace a fresh proc may only be mounted while a full
     * one is visible. */
    if (mount("proc", proc_dir, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0) rec.proc = 1;
    else fprintf(stderr, "fastcrit-jail: WARNING fresh /proc unavailable: %s\n", strerror(errno));
    enter_new_root();
    rec.newroot = 1;
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
