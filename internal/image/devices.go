package image

import (
	"archive/tar"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// layerFormat is the unpacker's version, kept in layerRecord.Format. From 2
// on, device nodes are recorded in the index instead of being created in
// the layer dir; Open converts the dirs of older layers.
const layerFormat = 2

// Device is a device node an image holds. It is never created on the host:
// the unpacker records it (and leaves nothing at its path), and the
// sandbox's runtime creates it inside the sandbox from the OCI spec's
// linux.devices (oci.Options.Devices), as rootless runtimes do.
type Device struct {
	Path  string `json:"path"` // absolute, inside the image
	Type  string `json:"type"` // "c" (character) or "b" (block)
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
	Mode  uint32 `json:"mode"` // permission bits
	UID   uint32 `json:"uid"`
	GID   uint32 `json:"gid"`
}

// Linux's device numbers: 12 bits of major, 20 of minor.
const (
	maxMajor = 1<<12 - 1
	maxMinor = 1<<20 - 1
)

func deviceOf(rel string, hdr *tar.Header) Device {
	t := "c"
	if hdr.Typeflag == tar.TypeBlock {
		t = "b"
	}
	return Device{Path: "/" + rel, Type: t, Major: hdr.Devmajor, Minor: hdr.Devminor,
		Mode: perm(hdr) & 0o777, UID: uint32(hdr.Uid), GID: uint32(hdr.Gid)}
}

// valid reports whether the kernel could make this device: a spec a
// runtime cannot apply would keep every sandbox of the image from starting.
func (d Device) valid() bool {
	return (d.Type == "c" || d.Type == "b") && d.Major >= 0 && d.Major <= maxMajor && d.Minor >= 0 && d.Minor <= maxMinor
}

// spec is the device as the OCI runtime spec's linux.devices entry.
func (d Device) spec() specs.LinuxDevice {
	mode := os.FileMode(d.Mode & 0o777)
	uid, gid := d.UID, d.GID
	return specs.LinuxDevice{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor, FileMode: &mode, UID: &uid, GID: &gid}
}

func sortDevices(ds []Device) {
	sort.Slice(ds, func(i, j int) bool { return ds[i].Path < ds[j].Path })
}

// imageDevices lists the device nodes an image shows, from its layers'
// records and dirs (bottom first, each dir once, as mounted). A device a
// layer recorded shows unless a higher layer has something at its path
// or a non-directory or opaque directory above it (in its dir, as
// overlayfs sees it), or records a device at its path or above it.
func imageDevices(recs []*layerRecord, dirs []string) []specs.LinuxDevice {
	var out []specs.LinuxDevice
	var above []string // paths of the devices higher layers record
	for i := len(recs) - 1; i >= 0; i-- {
	next:
		for _, d := range recs[i].Devices {
			for _, q := range above {
				if d.Path == q || strings.HasPrefix(d.Path, q+"/") {
					continue next
				}
			}
			for _, upper := range dirs[i+1:] {
				if hides(upper, d.Path) {
					continue next
				}
			}
			if d.valid() {
				out = append(out, d.spec())
			}
		}
		for _, d := range recs[i].Devices {
			above = append(above, d.Path)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// hides reports whether the layer dir hides path p of the layers below it.
func hides(dir, p string) bool {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := dir
	for k, c := range parts {
		cur = filepath.Join(cur, c)
		var st unix.Stat_t
		if err := unix.Lstat(cur, &st); err != nil {
			return !os.IsNotExist(err) // unsure: do not make the device
		}
		if k == len(parts)-1 || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return true
		}
		buf := make([]byte, 1)
		if n, err := unix.Lgetxattr(cur, opaqueXattr, buf); err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// scrubLayerDir converts a layer dir that an older version unpacked, with
// real device nodes in it: each is recorded and removed, as the unpacker
// does now. Whiteouts (0/0 character devices) stay.
func scrubLayerDir(dir string) ([]Device, error) {
	var out []Device
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.Type()&fs.ModeDevice == 0 {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		ifmt := st.Mode & unix.S_IFMT
		if ifmt == unix.S_IFCHR && st.Rdev == 0 {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		d := Device{Path: "/" + filepath.ToSlash(rel), Type: "c", Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev)),
			Mode: st.Mode & 0o777, UID: st.Uid, GID: st.Gid}
		if ifmt == unix.S_IFBLK {
			d.Type = "b"
		}
		var pst unix.Stat_t // the parent's times: this is not a change of the image
		perr := unix.Lstat(filepath.Dir(p), &pst)
		if err := os.Remove(p); err != nil {
			return err
		}
		if perr == nil {
			_ = unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Dir(p), []unix.Timespec{pst.Atim, pst.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
		}
		if len(out) < maxLayerDevices {
			out = append(out, d)
		}
		return nil
	})
	sortDevices(out)
	return out, err
}
