package guest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/useshards/shard/internal/agent/proto"

	"golang.org/x/sys/unix"
)

// grantError is a refusal with a code.
type grantError struct{ code, msg string }

func (e *grantError) Error() string { return e.msg }

// errReply is the reply to a failed op: its message, and its code when it
// has one.
func errReply(err error) proto.Reply {
	r := proto.Reply{Error: err.Error()}
	var ge *grantError
	if errors.As(err, &ge) {
		r.Code = ge.code
	}
	return r
}

// The file ops run here, in the agent, inside the sandbox: the path is
// resolved by the sandbox's own kernel (gVisor's, or the container's
// namespaces) and never by the host, which never follows a path into a
// sandbox's root file system.
//
// The path is walked one directory at a time from "/", each opened with
// O_PATH|O_NOFOLLOW and checked to be a directory (see openDir), and the
// last step is made relative to the
// directory that was opened: a symlink anywhere on the path is refused
// (CodePathUnsafe), never followed. What a sandbox does to the path
// between the walk and the write can only change which entry of that
// directory is replaced or removed, never send the write or the remove
// somewhere else.

// openParent opens path's parent directory, walking from "/" without
// following a symlink; with create, the directories that are missing are
// made (mode 0755) and returned in made, outermost first. On error none of
// them is left.
func openParent(path string, create bool) (dirfd int, base string, made []string, err error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
		return -1, "", nil, fmt.Errorf("path %q must be a clean absolute path", path)
	}
	parts := strings.Split(path[1:], "/")
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", nil, &os.PathError{Op: "open", Path: "/", Err: err}
	}
	cur := ""
	for _, name := range parts[:len(parts)-1] {
		cur += "/" + name
		nfd, err := openDir(fd, name)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, name, 0o755); err == nil {
				made = append(made, cur)
			}
			if err == nil || errors.Is(err, unix.EEXIST) {
				nfd, err = openDir(fd, name)
			}
		}
		unix.Close(fd)
		if err != nil {
			removeDirs(made)
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, "", nil, &grantError{proto.CodePathUnsafe, fmt.Sprintf("%s is a symlink or not a directory: a granted file's path follows no symlink (give the real path)", cur)}
			}
			return -1, "", nil, &os.PathError{Op: "open", Path: cur, Err: err}
		}
		fd = nfd
	}
	return fd, parts[len(parts)-1], made, nil
}

// openDir opens the directory name in dirfd, failing with ELOOP on a
// symlink and ENOTDIR on anything else that is not a directory.
//
// Not O_DIRECTORY|O_NOFOLLOW: gVisor follows a final symlink when
// O_DIRECTORY is given, O_NOFOLLOW or not (its path walk treats "must be a
// directory" like a trailing slash), so that would walk through the very
// symlink it must refuse. O_PATH|O_NOFOLLOW opens a symlink as itself
// (Linux) or fails with ELOOP, opens a FIFO or a device without side
// effects, and fstat says what it is. An O_PATH descriptor is a valid
// dirfd for the *at calls that follow.
func openDir(dirfd int, name string) (int, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return fd, nil
	case unix.S_IFLNK:
		unix.Close(fd)
		return -1, unix.ELOOP
	default:
		unix.Close(fd)
		return -1, unix.ENOTDIR
	}
}

// grantLike reports whether st is what a grant wrote: a regular file of
// the agent's user with exactly the grant's permission bits.
func grantLike(st *unix.Stat_t, mode os.FileMode) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Uid == uint32(os.Geteuid()) && os.FileMode(st.Mode&0o7777) == mode.Perm()
}

// describe says what st is, for a refusal's message.
func describe(st *unix.Stat_t) string {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFREG:
		return fmt.Sprintf("a file of uid %d, mode %#o", st.Uid, st.Mode&0o7777)
	default:
		return "not a regular file"
	}
}

// putGrantFile writes data as path (mode, 0400 if 0), atomically: a new
// file beside it, renamed into place. Missing parent directories are made
// and returned. With replace (the grant owns path: it wrote it before),
// an existing path is replaced if it still looks like what a grant wrote
// (grantLike); without, an existing path of any kind is refused
// (CodePathExists), and the rename cannot replace one that appears in the
// meantime.
func putGrantFile(path string, data []byte, mode os.FileMode, replace bool) (made []string, err error) {
	if mode == 0 {
		mode = 0o400
	}
	dirfd, base, made, err := openParent(path, true)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dirfd)
	fail := func(err error) ([]string, error) {
		removeDirs(made)
		return nil, err
	}
	var st unix.Stat_t
	switch err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil:
		if !replace {
			return fail(&grantError{proto.CodePathExists, fmt.Sprintf("%s exists (%s)", path, describe(&st))})
		}
		if !grantLike(&st, mode) {
			return fail(&grantError{proto.CodePathExists, fmt.Sprintf("%s is no longer the file the grant wrote: it is %s", path, describe(&st))})
		}
	case errors.Is(err, unix.ENOENT):
		replace = false // nothing to replace
	default:
		return fail(&os.PathError{Op: "stat", Path: path, Err: err})
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := ".shard-grant-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return fail(&os.PathError{Op: "create", Path: filepath.Join(filepath.Dir(path), tmp), Err: err})
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode.Perm()) // the umask may have taken bits away
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if replace {
			err = unix.Renameat(dirfd, tmp, dirfd, base)
		} else {
			err = renameNoReplace(dirfd, tmp, base)
		}
	}
	if err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		if errors.Is(err, unix.EEXIST) {
			return fail(&grantError{proto.CodePathExists, fmt.Sprintf("%s exists", path)})
		}
		return fail(&os.PathError{Op: "write", Path: path, Err: err})
	}
	return made, nil
}

// renameNoReplace renames tmp to base in dirfd unless base exists
// (EEXIST): renameat2's RENAME_NOREPLACE, or where the file system does
// not have it, a hard link (which fails on an existing name too) and the
// unlink of tmp.
func renameNoReplace(dirfd int, tmp, base string) error {
	err := unix.Renameat2(dirfd, tmp, dirfd, base, unix.RENAME_NOREPLACE)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	if err := unix.Linkat(dirfd, tmp, dirfd, base, 0); err != nil {
		return err
	}
	unix.Unlinkat(dirfd, tmp, 0)
	return nil
}

// removeGrantFile removes path if it is still what a grant wrote
// (grantLike with mode): a symlink, a directory or another file put in its
// place is left alone, and so is a path with a symlink on the way; left
// says what was left and why. An absent path is fine. Then dirs (the
// directories the grant made) are removed, innermost first, those that are
// empty only.
func removeGrantFile(path string, mode os.FileMode, dirs []string) (left string, err error) {
	if mode == 0 {
		mode = 0o400
	}
	defer removeDirs(dirs)
	dirfd, base, _, err := openParent(path, false)
	if err != nil {
		var ge *grantError
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return "", nil
		case errors.As(err, &ge):
			return ge.msg + ": nothing removed", nil
		}
		return "", err
	}
	defer unix.Close(dirfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "", nil
		}
		return "", &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if !grantLike(&st, mode) {
		return fmt.Sprintf("%s is no longer the file the grant wrote: it is %s; left as it is", path, describe(&st)), nil
	}
	if err := unix.Unlinkat(dirfd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return "", &os.PathError{Op: "remove", Path: path, Err: err}
	}
	return "", nil
}

// removeDirs removes the directories dirs (outermost first, as openParent
// made them) innermost first, each only if it is empty and still a
// directory: rmdir never follows a symlink, and the walk to each one
// follows none either.
func removeDirs(dirs []string) {
	for i := len(dirs) - 1; i >= 0; i-- {
		dirfd, base, _, err := openParent(dirs[i], false)
		if err != nil {
			continue
		}
		unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
		unix.Close(dirfd)
	}
}
