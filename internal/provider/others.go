package provider

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// Others returns the providers shard knows of but cannot run on this host
// yet, each with the reason found by looking at the host. They are listed so
// `shard capabilities` tells the truth about them: what they cannot do here
// is everything, so none claims fork, snapshots or checkpoints (a client
// that reads the flags alone must not offer a fork that fails). The seam
// (Provider plus Checkpointer) is where a real implementation goes.
func Others() []Provider {
	return []Provider{
		&Unavailable{Caps: Capabilities{Name: "firecracker", Isolation: "micro-VM (KVM)",
			Reason: firecrackerReason()}},
		&Unavailable{Caps: Capabilities{Name: "vz", Isolation: "virtual machine (Apple Virtualization.framework)",
			Reason: vzReason()}},
		&Unavailable{Caps: Capabilities{Name: "sysbox", Isolation: "system containers (sysbox-runc, user namespaces)",
			Reason: sysboxReason()}},
	}
}

func firecrackerReason() string {
	if runtime.GOOS != "linux" {
		return "firecracker runs on Linux only"
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "no /dev/kvm: this host has no hardware virtualisation"
	}
	if b, err := os.ReadFile("/proc/modules"); err == nil && strings.Contains(string(b), "kvm_pvm") || pvm() {
		return "/dev/kvm is kvm-pvm, which runs only PVM guest kernels; firecracker's guests cannot boot on it"
	}
	if _, err := exec.LookPath("firecracker"); err != nil {
		return "the firecracker binary is not installed, and shard's firecracker provider is not built yet"
	}
	return "shard's firecracker provider is not built yet"
}

// pvm reports whether KVM here is the PVM flavour (seen in sysfs).
func pvm() bool {
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return true
	}
	b, _ := os.ReadFile("/proc/cpuinfo")
	return !strings.Contains(string(b), " vmx") && !strings.Contains(string(b), " svm")
}

func vzReason() string {
	if runtime.GOOS != "darwin" || runtime.GOARCH != "arm64" {
		return "vz needs macOS 14 or later on Apple silicon; this host is " + runtime.GOOS + "/" + runtime.GOARCH
	}
	return "shard's vz provider is not built yet"
}

func sysboxReason() string {
	if _, err := exec.LookPath("sysbox-runc"); err != nil {
		return "sysbox-runc is not installed (it is not packaged for Debian 12)"
	}
	return "shard's sysbox provider is not built yet"
}
