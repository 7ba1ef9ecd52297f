package oci

import (
	"os"
	"reflect"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestBuildDevices(t *testing.T) {
	mode := os.FileMode(0o640)
	uid, gid := uint32(3), uint32(4)
	dev := func(p, typ string) specs.LinuxDevice {
		return specs.LinuxDevice{Path: p, Type: typ, Major: 1, Minor: 7, FileMode: &mode, UID: &uid, GID: &gid}
	}
	tests := []struct {
		name string
		in   []specs.LinuxDevice
		want []string // paths, in order
	}{
		{"none", nil, nil},
		{"under /dev", []specs.LinuxDevice{dev("/dev/sdb", "b"), dev("/dev/kmsg", "c"), dev("/dev/net/tap0", "c")},
			[]string{"/dev/kmsg", "/dev/net/tap0", "/dev/sdb"}},
		{"outside /dev: on the host", []specs.LinuxDevice{dev("/opt/null", "c"), dev("/dev", "c"), dev("/devices/x", "c")}, nil},
		{"not clean", []specs.LinuxDevice{dev("/dev/../etc/x", "c"), dev("dev/x", "c"), dev("/dev//x", "c"), dev("/dev/x/", "c")}, nil},
		{"the runtime's own", []specs.LinuxDevice{dev("/dev/null", "c"), dev("/dev/ptmx", "c"), dev("/dev/console", "c"),
			dev("/dev/pts/0", "c"), dev("/dev/mqueue/x", "c"), dev("/dev/shm/x", "c"), dev("/dev/fd/3", "c"),
			dev("/dev/char/1:7", "c"), dev("/dev/null/x", "c"), dev("/dev/stdin", "c")}, nil},
		{"not a char or block device", []specs.LinuxDevice{dev("/dev/p", "p"), dev("/dev/u", "u"), dev("/dev/e", "")}, nil},
		{"twice", []specs.LinuxDevice{dev("/dev/x", "c"), dev("/dev/x", "b")}, []string{"/dev/x"}},
		{"under another", []specs.LinuxDevice{dev("/dev/x/y", "c"), dev("/dev/x", "c"), dev("/dev/xy", "c")}, []string{"/dev/x", "/dev/xy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Build(Options{Devices: tt.in})
			var got []string
			for _, d := range s.Linux.Devices {
				got = append(got, d.Path)
				if d.Major != 1 || d.Minor != 7 || *d.FileMode != mode || *d.UID != uid || *d.GID != gid {
					t.Errorf("%s: %+v", d.Path, d)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("linux.devices %v, want %v", got, tt.want)
			}
		})
	}
}
