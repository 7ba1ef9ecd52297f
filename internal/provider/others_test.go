package provider

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The unavailable providers' reasons say what the host has, for each kind
// of host shard meets: a microVM with no /dev/kvm (CI), a PVM host, a
// machine with real KVM, with or without the binaries, and not Linux.
func TestOthersReasons(t *testing.T) {
	for _, tc := range []struct {
		name        string
		h           Host
		firecracker string
		vz          string
		sysbox      string
	}{
		{"no /dev/kvm", Host{OS: "linux", Arch: "amd64"},
			"no /dev/kvm on this host (firecracker needs KVM)",
			"vz needs macOS 14 or later on Apple silicon; this host is linux/amd64",
			"sysbox-runc is not installed (Debian has no package of it)"},
		{"kvm-pvm", Host{OS: "linux", Arch: "amd64", KVM: true, KVMModule: "kvm_pvm"},
			"/dev/kvm is kvm_pvm, which runs only PVM guest kernels: firecracker's guests cannot boot on it", "", ""},
		{"kvm_intel", Host{OS: "linux", Arch: "amd64", KVM: true, KVMModule: "kvm_intel"},
			"/dev/kvm present (module kvm_intel); the firecracker binary is not installed, and shard's firecracker provider is not built yet", "", ""},
		{"kvm on arm64, firecracker and sysbox installed", Host{OS: "linux", Arch: "arm64", KVM: true, KVMModule: "kvm",
			Firecracker: "/usr/bin/firecracker", SysboxRunc: "/usr/bin/sysbox-runc"},
			"/dev/kvm present (module kvm); firecracker is installed (/usr/bin/firecracker), but shard's firecracker provider is not built yet",
			"vz needs macOS 14 or later on Apple silicon; this host is linux/arm64",
			"sysbox-runc is installed (/usr/bin/sysbox-runc), but shard's sysbox provider is not built yet"},
		{"/dev/kvm and no module seen", Host{OS: "linux", Arch: "amd64", KVM: true},
			"/dev/kvm present (no KVM module seen in /sys/module); the firecracker binary is not installed, and shard's firecracker provider is not built yet", "", ""},
		{"macOS on Apple silicon", Host{OS: "darwin", Arch: "arm64"},
			"firecracker runs on Linux only; this host is darwin/arm64", "shard's vz provider is not built yet", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]string{}
			for _, p := range OthersOn(tc.h) {
				c := p.Probe(t.Context())
				if c.Available || c.Fork || c.Snapshot || c.Checkpoint {
					t.Errorf("%s claims what it cannot do here: %+v", c.Name, c)
				}
				got[c.Name] = c.Reason
			}
			for name, want := range map[string]string{"firecracker": tc.firecracker, "vz": tc.vz, "sysbox": tc.sysbox} {
				if want != "" && got[name] != want {
					t.Errorf("%s: reason %q, want %q", name, got[name], want)
				}
			}
		})
	}
}

// probeHost reads /dev/kvm and the KVM module from the host's files, the
// vendor's module ahead of kvm itself.
func TestProbeHost(t *testing.T) {
	none := func(string) (string, error) { return "", errors.New("not found") }
	for _, tc := range []struct {
		name   string
		files  []string
		kvm    bool
		module string
		look   func(string) (string, error)
		binary string
	}{
		{"a microVM: nothing", nil, false, "", none, ""},
		{"PVM", []string{"dev/kvm", "sys/module/kvm/", "sys/module/kvm_pvm/"}, true, "kvm_pvm", none, ""},
		{"Intel", []string{"dev/kvm", "sys/module/kvm/", "sys/module/kvm_intel/"}, true, "kvm_intel", none, ""},
		{"AMD", []string{"dev/kvm", "sys/module/kvm_amd/"}, true, "kvm_amd", none, ""},
		{"arm64", []string{"dev/kvm", "sys/module/kvm/"}, true, "kvm", func(n string) (string, error) { return "/opt/bin/" + n, nil }, "/opt/bin/firecracker"},
		{"module without the device", []string{"sys/module/kvm/"}, false, "kvm", none, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for _, f := range tc.files {
				p := filepath.Join(root, f)
				if strings.HasSuffix(f, "/") {
					if err := os.MkdirAll(p, 0o755); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			h := probeHost(root, tc.look)
			if h.KVM != tc.kvm || h.KVMModule != tc.module || h.Firecracker != tc.binary {
				t.Errorf("probeHost = %+v, want KVM %v, module %q, firecracker %q", h, tc.kvm, tc.module, tc.binary)
			}
		})
	}
}
