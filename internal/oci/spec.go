// Package oci builds the OCI runtime spec every provider starts from. The
// process is always shard's agent; what the user asked for (bounds, env,
// image config) is carried in resources and the agent's environment.
package oci

import (
	"fmt"
	"os"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// AgentDir is where the agent binary is mounted inside every sandbox.
const AgentDir = "/.shard"

// AgentPath is the agent binary inside the sandbox.
const AgentPath = AgentDir + "/shard"

// Options describe one sandbox instance.
type Options struct {
	Rootfs      string // mounted rootfs (absolute)
	Hostname    string
	Env         []string // the sandbox's environment: image env + user env
	AgentEnv    []string // extra env for the agent only (token, limits)
	AgentDir    string   // host directory holding the agent binary as "shard"
	Netns       string   // path of the network namespace
	CgroupsPath string   // e.g. /shard/<id>
	MemoryLimit int64    // bytes for the cgroup (0: none)
	CPUMillis   int64    // 1000 = one cpu (0: none)
	Pids        int64    // 0: none
	ResolvConf  string   // host file bind-mounted at /etc/resolv.conf
	Hosts       string   // host file bind-mounted at /etc/hosts
	HostnameF   string   // host file bind-mounted at /etc/hostname
	// Devices are the image's device nodes (image.Image.Devices), which
	// the runtime makes inside the sandbox: see sandboxDevices.
	Devices []specs.LinuxDevice
}

// defaultCaps is Docker's default capability set: what a process running as
// root in a container usually expects, and no more.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// HostFileMountOptions are the bind options of /etc/hosts, /etc/hostname
// and /etc/resolv.conf.
var HostFileMountOptions = []string{"rbind", "ro", "nosuid", "nodev", "noexec"}

// Build returns the spec.
func Build(o Options) *specs.Spec {
	nofile := uint64(65536)
	var rl unix.Rlimit
	// A spec asking for more than the host's hard limit is refused by runc.
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Max < nofile {
		nofile = rl.Max
	}
	s := &specs.Spec{
		Version:  specs.Version,
		Hostname: o.Hostname,
		Root:     &specs.Root{Path: o.Rootfs},
		Process: &specs.Process{
			Args: []string{AgentPath, "agent"},
			Env:  append(append([]string(nil), o.Env...), o.AgentEnv...),
			Cwd:  "/",
			User: specs.User{UID: 0, GID: 0},
			// No inheritable or ambient capabilities: a command the agent
			// starts as another user has none.
			Capabilities: &specs.LinuxCapabilities{
				Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps,
			},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: AgentDir, Type: "bind", Source: o.AgentDir, Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: o.CgroupsPath,
			Devices:     sandboxDevices(o.Devices),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace, Path: o.Netns},
			},
			Resources: &specs.LinuxResources{},
			// Docker's: the host kernel's memory, keyring, timers and
			// firmware unreadable, its tunables read-only. (gVisor's /proc
			// and /sys are the Sentry's own, and runsc ignores these.)
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
				"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
				"/proc/scsi", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	// The small host files are read-only inside: a writable bind of a host
	// file lets a sandbox plant a setuid-root binary on the host (chmod
	// 4755 /etc/hostname) and write past its disk bound.
	for _, m := range []struct{ dst, src string }{
		{"/etc/resolv.conf", o.ResolvConf}, {"/etc/hosts", o.Hosts}, {"/etc/hostname", o.HostnameF},
	} {
		if m.src != "" {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: m.dst, Type: "bind", Source: m.src, Options: HostFileMountOptions})
		}
	}
	r := s.Linux.Resources
	if o.MemoryLimit > 0 {
		lim := o.MemoryLimit
		r.Memory = &specs.LinuxMemory{Limit: &lim}
	}
	if o.CPUMillis > 0 {
		period := uint64(100000)
		quota := o.CPUMillis * 100
		r.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if o.Pids > 0 {
		p := o.Pids
		r.Pids = &specs.LinuxPids{Limit: &p}
	}
	return s
}

// WriteFile writes a small file for a bind mount (resolv.conf and friends)
// in place: a running sandbox's bind mount holds this very inode, so a
// warm spare's rename reaches it.
func WriteFile(path string, b []byte) error { return os.WriteFile(path, b, 0o644) }

// ConfineHostKernel confines a sandbox that shares the host kernel (runc)
// as Docker and Podman confine a container: no new privileges (no setuid
// binary or file capability raises a command above what it started with;
// `su` and a service dropping root still work, they need CAP_SETUID, not
// a setuid bit), and their default seccomp profile (moby/profiles), which
// follows s's bounding set: a syscall the profile allows only with a
// capability (unshare and clone of new namespaces, mount, setns, ... with
// CAP_SYS_ADMIN) is refused when s's bounding set lacks it. So call it on
// the finished spec.
//
// gVisor takes neither. Its sandboxes' syscalls reach the Sentry, not the
// host kernel (the Sentry runs under runsc's own host filter); runsc
// applies a spec's filter only with --oci-seccomp, and the agent there
// starts with CAP_SYS_ADMIN for its setup (gvisorAgentBounds), so the
// profile would allow what that capability does for the sandbox's whole
// life. And runsc refuses a restore whose spec differs from the
// checkpointed one (--restore-spec-validation=enforce compares
// Process.NoNewPrivileges and Linux.Seccomp), so a change here would make
// every checkpoint, environment and running sandbox made before it
// impossible to restore or fork.
func ConfineHostKernel(s *specs.Spec) error {
	p, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return fmt.Errorf("default seccomp profile: %w", err)
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.Seccomp = p
	if s.Process != nil {
		s.Process.NoNewPrivileges = true
	}
	return nil
}

// CgroupsPath is sandbox id's cgroup, under every v1 controller: the spec's
// cgroupsPath, and where the server and the runtimes look for it (a
// runtime's own cgroups for its commands go below it).
func CgroupsPath(id string) string { return "/shard/" + id }
