package oci

import (
	"path"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// devNames are the first components under /dev that no image device may
// take: what the runtime makes itself (its default devices, the links to
// /proc/self/fd, gVisor's /dev/char and /dev/block links), and the spec's
// own mounts there. An image's /dev/null is the runtime's anyway; and runc,
// given a spec device at a default device's path, drops that device's
// cgroup allow rule, and when mknod fails (devpts, mqueue) bind-mounts the
// host's node at the same path instead.
var devNames = map[string]bool{
	"null": true, "zero": true, "full": true, "random": true, "urandom": true,
	"tty": true, "console": true, "ptmx": true, "core": true,
	"fd": true, "stdin": true, "stdout": true, "stderr": true,
	"pts": true, "shm": true, "mqueue": true, "char": true, "block": true,
}

// sandboxDevices picks the image's device nodes that a sandbox gets in
// linux.devices. The runtime creates them inside the sandbox: runc in the
// /dev tmpfs of the container's own mount namespace, runsc in the
// Sentry's own /dev. Only nodes under /dev are kept: anywhere else the
// runtime would mknod on the rootfs, that is on the host (the sandbox's
// upper dir), and runsc's gofer refuses that (the sandbox would not boot).
// Access is unchanged: runc's device cgroup still allows only its default
// devices, and the Sentry opens only devices it implements (ENXIO else).
func sandboxDevices(in []specs.LinuxDevice) []specs.LinuxDevice {
	byPath := map[string]specs.LinuxDevice{}
	for _, d := range in {
		p := path.Clean(d.Path)
		rest, ok := strings.CutPrefix(p, "/dev/")
		if !ok || d.Path != p || rest == "" || devNames[strings.SplitN(rest, "/", 2)[0]] {
			continue
		}
		if d.Type != "c" && d.Type != "b" {
			continue
		}
		byPath[p] = d
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	// A stable order: runsc compares a restored sandbox's devices with its
	// checkpoint's.
	sort.Strings(paths)
	var out []specs.LinuxDevice
next:
	for _, p := range paths {
		for _, q := range out { // a device under a device cannot be made
			if strings.HasPrefix(p, q.Path+"/") {
				continue next
			}
		}
		out = append(out, byPath[p])
	}
	return out
}
