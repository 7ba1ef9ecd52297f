package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/useshards/shard/internal/agent/proto"

	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"
)

// Bounds the agent sets up inside a gVisor sandbox when it boots, as its
// init. gVisor enforces no --pids inside the sandbox (the host pids cgroup
// also counts the Sentry's threads and stubs, so it is only a backstop: a
// fork bomb that reaches it kills the whole sandbox), and it mounts a tmpfs
// on an empty /tmp, in the sandbox's memory.
//
// For these the agent starts with CAP_SYS_ADMIN and CAP_SYS_RESOURCE (the
// host adds them to the spec for gVisor only) and, before it serves
// anything, drops both from its bounding set (no command it runs can have
// either) and CAP_SYS_ADMIN altogether (see dropSetupCaps). What the host
// asks for comes in the agent's environment (proto.EnvPids, ...).

// nprocSlack is what RLIMIT_NPROC allows past the bound and the reserve:
// room for the agent's own threads (they count for uid 0 too) and for
// zombies not reaped yet.
const nprocSlack = 64

// cgroupMount is where the agent mounts gVisor's pids cgroup hierarchy for
// the moment it takes to set the bound up (gVisor's sysfs has this empty
// directory); it is unmounted before anything else runs.
const cgroupMount = "/sys/fs/cgroup"

// spawner starts commands from threads that sit in the bounded pids
// cgroups: in cgroup v1 a thread can be moved alone, and a child starts in
// the cgroup of the thread that forked it. The agent's other threads stay
// in the root cgroup, unbounded, so the agent itself never runs out of
// threads however many processes its commands made.
type spawner struct {
	bounded, reserve chan spawnReq

	// oomFirst: under runc, commands start with oom_score_adj 1000. In a
	// memory cgroup full of small processes (a fork bomb) the agent is
	// the biggest, and the host kernel's OOM killer would take it; with
	// this it takes a command while there is one. Set on the child just
	// after it started (not on the agent around the fork: the child of
	// Go's vfork shares the agent's memory, and the OOM killer takes every
	// process that shares its victim's). A command that forks in the
	// microseconds before leaves that child at the agent's value. Off under
	// gVisor, whose guard never picks the agent.
	oomFirst bool
}

type spawnReq struct {
	path string
	argv []string
	attr *os.ProcAttr
	res  chan spawnRes
}

type spawnRes struct {
	p   *os.Process
	err error
}

// start starts a command in the bounded cgroup, or in the reserve when the
// bounded one is full.
func (s *spawner) start(path string, argv []string, attr *os.ProcAttr) (*os.Process, error) {
	p, err := s.on(s.bounded, path, argv, attr)
	if err != nil && errors.Is(err, syscall.EAGAIN) && s.reserve != nil {
		return s.on(s.reserve, path, argv, attr)
	}
	return p, err
}

func (s *spawner) on(q chan spawnReq, path string, argv []string, attr *os.ProcAttr) (*os.Process, error) {
	res := make(chan spawnRes, 1)
	q <- spawnReq{path: path, argv: argv, attr: attr, res: res}
	r := <-res
	if r.err == nil && s.oomFirst {
		oomFirstOf(r.p.Pid)
	}
	return r.p, r.err
}

// spawnThread moves its own thread into the cgroups whose tasks files it is
// given, then starts what it is asked to, for ever. It never unlocks the
// thread: no other goroutine may run in that cgroup (and a thread the Go
// runtime makes while one is locked comes from its template thread, in the
// root cgroup).
func spawnThread(tasks []*os.File, q chan spawnReq, ready chan<- error) {
	runtime.LockOSThread()
	for _, f := range tasks {
		if _, err := f.WriteString("0"); err != nil { // "0": the writing thread
			ready <- fmt.Errorf("move a spawner thread into %s: %w", f.Name(), err)
			return // the locked thread ends with the goroutine
		}
	}
	ready <- nil
	for r := range q {
		p, err := os.StartProcess(r.path, r.argv, r.attr)
		r.res <- spawnRes{p, err}
	}
}

// oomFirstOf makes a command the OOM killer's first choice over the agent
// (see spawner.oomFirst).
func oomFirstOf(pid int) {
	f, err := os.OpenFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", os.O_WRONLY, 0)
	if err != nil {
		return
	}
	f.WriteString("1000")
	f.Close()
}

// setupPids makes two pids cgroups in gVisor's hierarchy: "sandbox", bound
// to n processes (threads included, as in Linux), where every command
// starts, and "reserve" (PidsReserve). It returns the spawner that starts
// commands in them. The hierarchy is mounted only for the moment this takes
// (commands never see it) and gVisor keeps it, and the threads' places in
// it, across checkpoint and restore.
func setupPids(n int64) (*spawner, error) {
	// gVisor drops a task from its cgroups when it exits, not when it is
	// reaped, so zombies are not counted against pids.max (in Linux they
	// are): a fork bomb whose orphans end faster than the agent reaps them
	// piles up zombies without bound, and the agent, one process among
	// hundreds sharing the CPU, falls ever further behind. RLIMIT_NPROC
	// counts a user's tasks until they are reaped; commands inherit this
	// one (hard: they cannot raise it), so the bomb waits for the agent.
	// The agent itself is exempt (CAP_SYS_RESOURCE), and its own threads
	// (uid 0's too) are what nprocSlack leaves room for.
	lim := uint64(n + proto.PidsReserve + nprocSlack)
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: lim, Max: lim}); err != nil {
		return nil, fmt.Errorf("RLIMIT_NPROC: %w", err)
	}
	if err := unix.Mount("cgroup", cgroupMount, "cgroup", 0, "pids"); err != nil {
		return nil, fmt.Errorf("mount the pids cgroup on %s: %w", cgroupMount, err)
	}
	defer unix.Unmount(cgroupMount, unix.MNT_DETACH)
	s := &spawner{bounded: make(chan spawnReq), reserve: make(chan spawnReq)}
	for _, cg := range []struct {
		name string
		max  int64
		q    chan spawnReq
	}{{"sandbox", n, s.bounded}, {"reserve", proto.PidsReserve, s.reserve}} {
		dir := cgroupMount + "/" + cg.name
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("pids cgroup: %w", err)
		}
		// +1: the spawner thread is in it too.
		if err := os.WriteFile(dir+"/pids.max", []byte(strconv.FormatInt(cg.max+1, 10)), 0); err != nil {
			return nil, fmt.Errorf("pids cgroup: %w", err)
		}
		tasks, err := os.OpenFile(dir+"/tasks", os.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("pids cgroup: %w", err)
		}
		ready := make(chan error, 1)
		go spawnThread([]*os.File{tasks}, cg.q, ready)
		err = <-ready
		tasks.Close()
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// spawnerFromTasks starts the spawner threads in the cgroups whose tasks
// files the host handed over as descriptors (EnvPidsTasks: "3+5+6,4+5+6",
// the bounded thread's, then the reserve's), then closes them: commands
// must not inherit them.
func spawnerFromTasks(spec string) (*spawner, error) {
	b, r, ok := strings.Cut(spec, ",")
	if !ok {
		return nil, fmt.Errorf("bad %s %q", proto.EnvPidsTasks, spec)
	}
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	s := &spawner{bounded: make(chan spawnReq), reserve: make(chan spawnReq), oomFirst: true}
	for _, x := range []struct {
		fds string
		q   chan spawnReq
	}{{b, s.bounded}, {r, s.reserve}} {
		var tasks []*os.File
		for _, n := range strings.Split(x.fds, "+") {
			fd, err := strconv.Atoi(n)
			if err != nil || fd < 3 {
				return nil, fmt.Errorf("bad %s %q", proto.EnvPidsTasks, spec)
			}
			if files[n] == nil {
				files[n] = os.NewFile(uintptr(fd), "tasks-"+n)
			}
			tasks = append(tasks, files[n])
		}
		ready := make(chan error, 1)
		go spawnThread(tasks, x.q, ready)
		if err := <-ready; err != nil {
			return nil, err
		}
	}
	return s, nil
}

// tmpOnDisk unmounts the tmpfs gVisor mounted on /tmp (it does when the
// image's /tmp is empty and the spec mounts nothing there), so /tmp is the
// rootfs's own directory: on disk, bounded by --disk and not by memory,
// kept across stop and start, as under runc. An image without /tmp gets
// one (mode 1777).
func tmpOnDisk() error {
	fstype, err := mountType("/tmp")
	if err != nil {
		return err
	}
	if fstype == "tmpfs" {
		if err := unix.Unmount("/tmp", 0); err != nil {
			return fmt.Errorf("unmount the tmpfs on /tmp: %w", err)
		}
	}
	if _, err := os.Lstat("/tmp"); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir("/tmp", 0o777); err != nil {
			return err
		}
		return os.Chmod("/tmp", 0o777|os.ModeSticky)
	}
	return nil
}

// mountType is the filesystem type mounted at dir ("" when nothing is).
func mountType(dir string) (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	defer f.Close()
	fstype := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// device mountpoint fstype options ...; the last mount wins.
		if fl := strings.Fields(sc.Text()); len(fl) >= 3 && fl[1] == dir {
			fstype = fl[2]
		}
	}
	return fstype, sc.Err()
}

// dropSetupCaps gives up, on every thread of the agent, what it was started
// with for its setup: CAP_SYS_ADMIN altogether, and CAP_SYS_RESOURCE from
// its bounding set, so no command it starts can have either. Every thread:
// psx does it through Go's AllThreadsSyscall without cgo, and through the C
// library's threads in a build with cgo (cmd/shard/static.go), where Go's
// refuses. It keeps
// CAP_SYS_RESOURCE for itself: gVisor exempts its holder from
// RLIMIT_NPROC, so the agent can always make a thread and start a command
// however many processes its commands made. Then it checks the result.
func dropSetupCaps() error {
	for _, c := range []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SYS_RESOURCE} {
		if _, _, e := psx.Syscall3(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); e != 0 {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, e)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	bit := uint32(1) << (unix.CAP_SYS_ADMIN % 32)
	i := unix.CAP_SYS_ADMIN / 32
	data[i].Effective &^= bit
	data[i].Permitted &^= bit
	data[i].Inheritable &^= bit
	_, _, e := psx.Syscall3(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	runtime.KeepAlive(&hdr)
	runtime.KeepAlive(&data)
	if e != 0 {
		return fmt.Errorf("drop CAP_SYS_ADMIN: %w", e)
	}
	return checkCaps()
}

// checkCaps reads back the agent's capability sets: no CAP_SYS_ADMIN in
// any, no CAP_SYS_RESOURCE in the bounding set.
func checkCaps() error {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "CapBnd" && k != "CapPrm" && k != "CapEff") {
			continue
		}
		set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		if set&(1<<unix.CAP_SYS_ADMIN) != 0 {
			return fmt.Errorf("CAP_SYS_ADMIN is still in %s", k)
		}
		if k == "CapBnd" && set&(1<<unix.CAP_SYS_RESOURCE) != 0 {
			return fmt.Errorf("CAP_SYS_RESOURCE is still in %s", k)
		}
	}
	return nil
}
