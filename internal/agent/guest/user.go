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

// lookupUser resolves "name", "uid", "name:group" or "uid:gid" against the
// sandbox's own /etc/passwd and /etc/group. An empty spec is the agent's own
// user (root). It returns the credential to run as and the user's home.
func lookupUser(spec string) (*syscall.Credential, string, error) {
	if spec == "" {
		return nil, homeOf("0"), nil
	}
	u, g, hasGroup := strings.Cut(spec, ":")
	uid, gid, home, name, err := resolvePasswd(u)
	if err != nil {
		return nil, "", err
	}
	if hasGroup {
		gid, err = resolveGroup(g)
		if err != nil {
			return nil, "", err
		}
	}
	cred := &syscall.Credential{Uid: uid, Gid: gid, Groups: supplementary(name, gid)}
	return cred, home, nil
}

// maxColonFile bounds what a lookup reads of /etc/passwd or /etc/group.
// The sandbox controls both: far more than any real one holds, and a file
// past it is read no further.
const maxColonFile = 4 << 20

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
	sc := bufio.NewScanner(io.LimitReader(fh, maxColonFile))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if fn(strings.Split(line, ":")) {
			return
		}
	}
}

// resolvePasswd finds a user by name or uid; name is the passwd name ("" for
// a uid that is not in /etc/passwd).
func resolvePasswd(u string) (uid, gid uint32, home, name string, err error) {
	found := false
	readColonFile("/etc/passwd", func(f []string) bool {
		if len(f) < 6 || (f[0] != u && f[2] != u) {
			return false
		}
		a, e1 := strconv.ParseUint(f[2], 10, 32)
		b, e2 := strconv.ParseUint(f[3], 10, 32)
		if e1 != nil || e2 != nil {
			return false
		}
		home = f[5]
		if home == "" {
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
	return uint32(n), uint32(n), "/", "", nil
}

func resolveGroup(g string) (uint32, error) {
	var gid uint32
	found := false
	readColonFile("/etc/group", func(f []string) bool {
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

func supplementary(user string, primary uint32) []uint32 {
	var out []uint32
	if user == "" {
		return nil
	}
	readColonFile("/etc/group", func(f []string) bool {
		if len(f) < 4 {
			return false
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == user {
				if n, err := strconv.ParseUint(f[2], 10, 32); err == nil && uint32(n) != primary {
					out = append(out, uint32(n))
				}
			}
		}
		return false
	})
	return out
}

func homeOf(uid string) string {
	_, _, home, _, err := resolvePasswd(uid)
	if err != nil {
		return "/root"
	}
	return home
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
