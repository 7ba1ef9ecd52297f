package provider

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Others returns the providers shard knows of but cannot run on this host
// yet, each with the reason found by looking at the host. They are listed so
// `shard capabilities` tells the truth about them: what they cannot do here
// is everything, so none claims fork, snapshots or checkpoints (a client
// that reads the flags alone must not offer a fork that fails). The seam
// (Provider plus Checkpointer) is where a real implementation goes.
func Others() []Provider { return OthersOn(ProbeHost()) }

// OthersOn is Others on a host described by h.
func OthersOn(h Host) []Provider {
	return []Provider{
		&Unavailable{Caps: Capabilities{Name: "firecracker", Isolation: "micro-VM (KVM)",
			Reason: firecrackerReason(h)}},
		&Unavailable{Caps: Capabilities{Name: "vz", Isolation: "virtual machine (Apple Virtualization.framework)",
			Reason: vzReason(h)}},
		&Unavailable{Caps: Capabilities{Name: "sysbox", Isolation: "system containers (sysbox-runc, user namespaces)",
			Reason: sysboxReason(h)}},
	}
}

// Host is what the unavailable providers' reasons are made of: what this
// host has, as seen at start-up, never what the machine shard was written
// on had. ProbeHost reads it; a test writes one by hand.
type Host struct {
	OS, Arch    string
	KVM         bool   // /dev/kvm exists
	KVMModule   string // the KVM module in /sys/module (kvm_intel, kvm_amd, kvm_pvm, kvm), "" if none
	Firecracker string // the firecracker binary's path, "" if it is not on PATH
	SysboxRunc  string // sysbox-runc's path, "" if it is not on PATH
}

// ProbeHost looks at this host.
func ProbeHost() Host { return probeHost("/", exec.LookPath) }

// probeHost looks at the host whose root is root, finding binaries with
// look (a test gives a directory and a lookup of its own).
func probeHost(root string, look func(string) (string, error)) Host {
	h := Host{OS: runtime.GOOS, Arch: runtime.GOARCH}
	if _, err := os.Stat(filepath.Join(root, "dev", "kvm")); err == nil {
		h.KVM = true
	}
	// The vendor's module first: kvm itself is loaded under each of them.
	// /sys/module lists built-in modules too (those with parameters, as
	// every KVM module has), where /proc/modules does not.
	for _, m := range []string{"kvm_pvm", "kvm_intel", "kvm_amd", "kvm"} {
		if _, err := os.Stat(filepath.Join(root, "sys", "module", m)); err == nil {
			h.KVMModule = m
			break
		}
	}
	h.Firecracker, _ = look("firecracker")
	h.SysboxRunc, _ = look("sysbox-runc")
	return h
}

func firecrackerReason(h Host) string {
	if h.OS != "linux" {
		return "firecracker runs on Linux only; this host is " + h.OS + "/" + h.Arch
	}
	if !h.KVM {
		return "no /dev/kvm on this host (firecracker needs KVM)"
	}
	if h.KVMModule == "kvm_pvm" {
		return "/dev/kvm is kvm_pvm, which runs only PVM guest kernels: firecracker's guests cannot boot on it"
	}
	kvm := "/dev/kvm present (module " + h.KVMModule + ")"
	if h.KVMModule == "" {
		kvm = "/dev/kvm present (no KVM module seen in /sys/module)"
	}
	if h.Firecracker == "" {
		return kvm + "; the firecracker binary is not installed, and shard's firecracker provider is not built yet"
	}
	return kvm + "; firecracker is installed (" + h.Firecracker + "), but shard's firecracker provider is not built yet"
}

func vzReason(h Host) string {
	if h.OS != "darwin" || h.Arch != "arm64" {
		return "vz needs macOS 14 or later on Apple silicon; this host is " + h.OS + "/" + h.Arch
	}
	return "shard's vz provider is not built yet"
}

func sysboxReason(h Host) string {
	if h.SysboxRunc == "" {
		return "sysbox-runc is not installed (Debian has no package of it)"
	}
	return "sysbox-runc is installed (" + h.SysboxRunc + "), but shard's sysbox provider is not built yet"
}
