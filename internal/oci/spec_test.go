package oci

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestBuildHardening(t *testing.T) {
	s := Build(Options{Rootfs: "/r", AgentDir: "/a"})
	c := s.Process.Capabilities
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
		if !slices.Equal(set, defaultCaps) {
			t.Errorf("%s: %v, want Docker's defaults %v", name, set, defaultCaps)
		}
	}
	if len(c.Inheritable) != 0 || len(c.Ambient) != 0 {
		t.Errorf("inheritable %v, ambient %v: want none", c.Inheritable, c.Ambient)
	}
	for _, path := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/sys/firmware", "/proc/acpi", "/proc/scsi"} {
		if !slices.Contains(s.Linux.MaskedPaths, path) {
			t.Errorf("%s is not masked", path)
		}
	}
	for _, path := range []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"} {
		if !slices.Contains(s.Linux.ReadonlyPaths, path) {
			t.Errorf("%s is not read-only", path)
		}
	}
	// What gVisor runs under: a change to it would make runsc refuse to
	// restore every checkpoint taken before (ConfineHostKernel).
	if s.Linux.Seccomp != nil || s.Process.NoNewPrivileges {
		t.Error("Build set a seccomp filter or no new privileges: only runc takes them (ConfineHostKernel)")
	}
}

// allowed says whether the filter lets syscall name through
// unconditionally.
func allowed(sc *specs.LinuxSeccomp, name string) bool {
	for _, r := range sc.Syscalls {
		if r.Action == specs.ActAllow && len(r.Args) == 0 && slices.Contains(r.Names, name) {
			return true
		}
	}
	return false
}

func TestConfineHostKernel(t *testing.T) {
	for _, tc := range []struct {
		name    string
		extra   []string // added to the bounding set
		syscall string
		want    bool
	}{
		{"read", nil, "read", true},
		{"setuid for su and apt", nil, "setuid", true},
		{"chown", nil, "chown", true},
		{"unshare without CAP_SYS_ADMIN", nil, "unshare", false},
		{"mount without CAP_SYS_ADMIN", nil, "mount", false},
		{"setns without CAP_SYS_ADMIN", nil, "setns", false},
		{"keyctl", nil, "keyctl", false},
		{"bpf", nil, "bpf", false},
		{"kexec_load", nil, "kexec_load", false},
		{"unshare with CAP_SYS_ADMIN", []string{"CAP_SYS_ADMIN"}, "unshare", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Build(Options{Rootfs: "/r", AgentDir: "/a"})
			s.Process.Capabilities.Bounding = append(slices.Clone(s.Process.Capabilities.Bounding), tc.extra...)
			if err := ConfineHostKernel(s); err != nil {
				t.Fatal(err)
			}
			if !s.Process.NoNewPrivileges {
				t.Error("NoNewPrivileges is off")
			}
			sc := s.Linux.Seccomp
			if sc == nil || sc.DefaultAction != specs.ActErrno || len(sc.Architectures) == 0 {
				t.Fatalf("filter %+v: want a default of errno and this machine's architectures", sc)
			}
			if got := allowed(sc, tc.syscall); got != tc.want {
				t.Errorf("%s allowed: %v, want %v", tc.syscall, got, tc.want)
			}
		})
	}
}
