package guest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// etcFiles are the user and group databases a lookup reads: the
// sandbox's own /etc/passwd and /etc/group (the agent's root is the
// sandbox's), or a test's.
type etcFiles struct{ passwd, group string }

// lookupUser resolves "name", "uid", "name:group" or "uid:gid" against the
// sandbox's own /etc/passwd and /etc/group. An empty spec is the agent's own
// user (root). It returns the credential to run as and the user's home.
func lookupUser(spec string) (*syscall.Credential, string, error) {
	return etcFiles{passwd: "/etc/passwd", group: "/etc/group"}.lookupUser(spec)
}

func (e etcFiles) lookupUser(spec string) (*syscall.Credential, string, error) {
	if spec == "" {
		_, _, home, _, _ := e.resolvePasswd("0") // a uid: never an error
		return nil, home, nil
	}
	u, g, hasGroup := strings.Cut(spec, ":")
	uid, gid, home, name, err := e.resolvePasswd(u)
	if err != nil {
		return nil, "", err
	}
	if hasGroup {
		gid, err = e.resolveGroup(g)
		if err != nil {
			return nil, "", err
		}
	}
	cred := &syscall.Credential{Uid: uid, Gid: gid, Groups: e.supplementary(name, gid)}
	return cred, home, nil
}

// maxColonFile bounds what a lookup reads of /etc/passwd or /etc/group.
// The sandbox controls both: far more than any real one holds, and a file
// past it is read no further.
const maxColonFile = 4 << 20

// maxColonLine bounds one entry of /etc/passwd or /etc/group: a longer
// line is skipped, and the lines after it are read.
const maxColonLine = 64 << 10

// readColonFile calls fn with each entry of path (a file of the sandbox's
// own, opened inside it: the agent's root is the sandbox's) until fn says
// it is done. A file that is missing, or not a regular file (a FIFO that
// would block, a device that never ends), has no entries.
func readColonFile(path string, fn func(f []string) bool) {
	// O_NONBLOCK: opening a FIFO does not wait for a writer.
	fh, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return
	}
	defer fh.Close()
	if st, err := fh.Stat(); err != nil || !st.Mode().IsRegular() {
		return
	}
	r := bufio.NewReaderSize(io.LimitReader(fh, maxColonFile), maxColonLine)
	for {
		b, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) { // the rest of the long line
				_, err = r.ReadSlice('\n')
			}
			if err != nil {
				return
			}
			continue
		}
		line := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if line != "" && !strings.HasPrefix(line, "#") && fn(strings.Split(line, ":")) {
			return
		}
		if err != nil { // io.EOF, or the bound
			return
		}
	}
}

// resolvePasswd finds a user by name or uid; name is the passwd name ("" for
// a uid that is not in /etc/passwd).
func (e etcFiles) resolvePasswd(u string) (uid, gid uint32, home, name string, err error) {
	found := false
	readColonFile(e.passwd, func(f []string) bool {
		if len(f) < 6 || (f[0] != u && f[2] != u) {
			return false
		}
		a, e1 := strconv.ParseUint(f[2], 10, 32)
		b, e2 := strconv.ParseUint(f[3], 10, 32)
		if e1 != nil || e2 != nil {
			return false
		}
		home = f[5]
		// A NUL ends a C string: HOME with one is an environment the
		// kernel refuses (the exec fails), so it is no home at all.
		if home == "" || strings.ContainsRune(home, 0) {
			home = "/"
		}
		uid, gid, name, found = uint32(a), uint32(b), f[0], true
		return true
	})
	if found {
		return uid, gid, home, name, nil
	}
	n, perr := strconv.ParseUint(u, 10, 32)
	if perr != nil {
		return 0, 0, "", "", fmt.Errorf("user %q is not in the sandbox's /etc/passwd", u)
	}
	// A uid with no entry (or no readable /etc/passwd) has no home, but
	// root's is /root, as podman and docker give it.
	home = "/"
	if n == 0 {
		home = "/root"
	}
	return uint32(n), uint32(n), home, "", nil
}

func (e etcFiles) resolveGroup(g string) (uint32, error) {
	var gid uint32
	found := false
	readColonFile(e.group, func(f []string) bool {
		if len(f) < 3 || (f[0] != g && f[2] != g) {
			return false
		}
		n, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return false
		}
		gid, found = uint32(n), true
		return true
	})
	if found {
		return gid, nil
	}
	n, err := strconv.ParseUint(g, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("group %q is not in the sandbox's /etc/group", g)
	}
	return uint32(n), nil
}

// ngroupsMax is the kernel's NGROUPS_MAX (and gVisor's): setgroups refuses
// a longer list, and the exec with it.
const ngroupsMax = 65536

// supplementary are the groups /etc/group lists user in, besides primary:
// the first ngroupsMax of them.
func (e etcFiles) supplementary(user string, primary uint32) []uint32 {
	var out []uint32
	if user == "" {
		return nil
	}
	readColonFile(e.group, func(f []string) bool {
		if len(f) < 4 {
			return false
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == user {
				if n, err := strconv.ParseUint(f[2], 10, 32); err == nil && uint32(n) != primary {
					out = append(out, uint32(n))
				}
				break
			}
		}
		return len(out) == ngroupsMax
	})
	return out
}

// lookPath finds a program the way a shell does, with the command's PATH
// (not the agent's).
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return name, nil
	}
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found in the sandbox (PATH=%s)", name, path)
}

func executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errors.New("no such file")
		}
		return err
	}
	if st.IsDir() {
		return errors.New("is a directory")
	}
	if st.Mode()&0o111 == 0 {
		return errors.New("permission denied")
	}
	return nil
}
