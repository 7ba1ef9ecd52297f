package gvisor

import (
	"slices"
	"strconv"
	"testing"

	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/internal/oci"
)

func TestGuestSpec(t *testing.T) {
	p := &Provider{}
	a := oci.Build(oci.Options{Rootfs: "/r"})
	p.GuestSpec(a, 1<<30, 321)
	b := oci.Build(oci.Options{Rootfs: "/r"})
	for _, set := range [][]string{a.Process.Capabilities.Bounding, a.Process.Capabilities.Effective, a.Process.Capabilities.Permitted} {
		if !slices.Contains(set, "CAP_SYS_ADMIN") || !slices.Contains(set, "CAP_SYS_RESOURCE") {
			t.Errorf("gVisor agent's capabilities %v lack CAP_SYS_ADMIN or CAP_SYS_RESOURCE (it sets the bounds up with them)", set)
		}
	}
	for _, set := range [][]string{b.Process.Capabilities.Bounding, b.Process.Capabilities.Effective, b.Process.Capabilities.Permitted} {
		if slices.Contains(set, "CAP_SYS_ADMIN") || slices.Contains(set, "CAP_SYS_RESOURCE") {
			t.Errorf("a spec built after a gVisor one has the setup capabilities: %v (shared default slice)", set)
		}
	}
	for _, kv := range []string{proto.EnvPids + "=321", proto.EnvTmpOnDisk + "=1", proto.EnvMemoryLimit + "=" + strconv.Itoa(1<<30)} {
		if !slices.Contains(a.Process.Env, kv) {
			t.Errorf("agent env %v lacks %s", a.Process.Env, kv)
		}
	}
	if m, n := p.HostBounds(1<<30, 64); m != 1<<30+256<<20 || n != 640 {
		t.Errorf("HostBounds(1 GiB, 64) = %d, %d; want 1.25 GiB, 640", m, n)
	}
}

func TestPidsInside(t *testing.T) {
	const mib = 1 << 20
	tests := []struct{ pids, mem, want int64 }{
		{4096, 512 * mib, 512}, // one per MiB of memory
		{256, 512 * mib, 256},  // --pids when lower
		{4096, 16 << 30, 4096}, // --pids when memory allows more
		{4096, 32 * mib, 64},   // never fewer than 64
		{8, 32 * mib, 8},       // unless --pids is
		{0, 512 * mib, 0},      // none asked, none set
	}
	for _, tt := range tests {
		if got := PidsInside(tt.pids, tt.mem); got != tt.want {
			t.Errorf("PidsInside(%d, %d MiB) = %d, want %d", tt.pids, tt.mem/mib, got, tt.want)
		}
	}
}
