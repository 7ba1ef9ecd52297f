package gvisor

import (
	"slices"
	"strconv"

	"github.com/useshards/shard/internal/agent/proto"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/useshards/shard/internal/provider"
)

// gVisor's Sentry has no OOM killer and counts its own threads in the host
// pids cgroup: the sandbox's agent holds the bounds inside, and the host
// cgroup is a backstop (see provider.Guest).
var _ provider.Guest = (*Provider)(nil)

// MinCPU is gVisor's floor: its kernel boots in user space, and at 10m a
// sandbox took over 100 s to answer (50m: 16 s).
const MinCPU = 100

// MinCPU is the least CPU a gVisor sandbox boots with in reasonable time.
func (p *Provider) MinCPU() int64 { return MinCPU }

// HostBounds: the memory bound plus headroom for the Sentry, so that the
// host kernel never kills the whole sandbox before the agent kills one
// process at the bound; and PidsBackstop.
func (p *Provider) HostBounds(memory, pids int64) (hostMemory, hostPids int64) {
	return CgroupLimit(memory), PidsBackstop(pids)
}

// CgroupLimit is the host memory cgroup's bound of a gVisor sandbox whose
// guest may use mem: the bound plus headroom for the Sentry.
func CgroupLimit(mem int64) int64 { return mem + max(64<<20, mem/4) }

// PidsBackstop is the host pids bound of a gVisor sandbox whose guest may
// have n processes. The host pids cgroup also counts the Sentry's threads
// and the systrap stubs (about one per guest thread), and a Sentry that
// cannot make a thread hangs the whole sandbox: the bound is twice the
// guest's plus room for the Sentry.
func PidsBackstop(n int64) int64 { return 2*n + 512 }

// GuestSpec has the agent of a gVisor sandbox enforce, inside, what the
// runtime does not (see internal/agent/guest/bounds.go): the memory bound (it is
// the sandbox's OOM killer), --pids, with gVisor's own pids cgroup (the
// host pids cgroup stays as a backstop), and /tmp on the rootfs's disk
// instead of the tmpfs runsc mounts there, which holds its files in the
// sandbox's memory (a full /tmp was memory the OOM guard could not free, so
// it killed every command, rm too). For that setup the agent starts with
// CAP_SYS_ADMIN and CAP_SYS_RESOURCE; before it serves it drops both from
// its bounding set (nothing it runs has either) and CAP_SYS_ADMIN
// altogether; it keeps CAP_SYS_RESOURCE, which exempts it from the
// RLIMIT_NPROC its commands get.
func (p *Provider) GuestSpec(spec *specs.Spec, memory, pids int64) {
	if memory > 0 {
		spec.Process.Env = append(spec.Process.Env, proto.EnvMemoryLimit+"="+strconv.FormatInt(memory, 10))
	}
	spec.Process.Env = append(spec.Process.Env, proto.EnvTmpOnDisk+"=1")
	if n := PidsInside(pids, memory); n > 0 {
		spec.Process.Env = append(spec.Process.Env, proto.EnvPids+"="+strconv.FormatInt(n, 10))
	}
	setup := []string{"CAP_SYS_ADMIN", "CAP_SYS_RESOURCE"}
	c := spec.Process.Capabilities
	c.Bounding = slices.Concat(c.Bounding, setup)
	c.Effective = slices.Concat(c.Effective, setup)
	c.Permitted = slices.Concat(c.Permitted, setup)
}

// PidsInside is the process bound inside a gVisor sandbox: --pids, but no
// more than one per MiB of --memory (and no fewer than 64). Under gVisor
// every process also costs the host memory the sandbox's own view does not
// show: the Sentry's state for its task and address space and the systrap
// stub that runs it, 250-330 KiB, charged to the host cgroup whose headroom
// is all the guest cannot see. And every one competes for the CPU with the
// agent, the guard included: a bash fork bomb held at 4096 processes in a
// 512 MiB sandbox starved the agent (no answer within 10 s) and took the
// host cgroup past its limit in 30 s, while held at 256 the agent answered
// in milliseconds and the host cgroup stayed at 235 MiB. At one process per
// MiB a bomb fits in the bound (measured: 450 KiB of guest memory and ~300
// KiB of host overhead per bash process).
func PidsInside(pids, mem int64) int64 {
	if pids <= 0 {
		return 0
	}
	return min(pids, max(64, mem>>20))
}
