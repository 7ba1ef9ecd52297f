// Package files moves files in and out of a sandbox. It is the body of
// `shard files-helper`, a process that runs inside a running sandbox (an
// exec of the agent's own binary, as root) or, for a stopped sandbox, on the
// host chrooted into the sandbox's files. Either way every path resolves in
// the sandbox's root by the kernel the sandbox uses, so no path, symlink or
// archive entry that a sandbox controls can name a host file; and inside a
// running gVisor sandbox the Sentry, which caches what it knows of its
// files, sees every change made here.
//
// The protocol is the helper's stdio: the input (a file's bytes, a tar) on
// stdin; on stdout one JSON line (a Result), then for a read the bytes. A
// read that fails once its bytes have begun exits with status 2 and says why
// on stderr.
package files

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/useshards/shard/client"
)

// Info describes one file of a sandbox.
type Info struct {
	Name  string    `json:"name"`
	Path  string    `json:"path"`
	Type  string    `json:"type"` // file, dir, symlink, fifo, socket, char, block
	Size  int64     `json:"size"`
	Mode  uint32    `json:"mode"` // permission bits with setuid, setgid and sticky (07777)
	UID   int       `json:"uid"`
	GID   int       `json:"gid"`
	MTime time.Time `json:"mtime"`
	Link  string    `json:"link,omitempty"` // a symlink's target
}

// Types of Info.Type.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeFIFO    = "fifo"
	TypeSocket  = "socket"
	TypeChar    = "char"
	TypeBlock   = "block"
)

// Result is the helper's JSON line.
type Result struct {
	OK      bool   `json:"ok"`
	Code    string `json:"code,omitempty"` // a failure's code (Code*)
	Message string `json:"message,omitempty"`

	Info      *Info    `json:"info,omitempty"`    // stat, get: the file
	Entries   []Info   `json:"entries,omitempty"` // list
	Truncated bool     `json:"truncated,omitempty"`
	Bytes     int64    `json:"bytes,omitempty"` // put: bytes written
	Files     int      `json:"files,omitempty"` // put: files, directories and links made
	Notes     []string `json:"notes,omitempty"` // put: what was sanitised or skipped
}

// Codes of a failed Result. The host maps each to an API error.
const (
	CodeNotFound   = client.CodeFileNotFound
	CodeIsDir      = client.CodeIsADirectory
	CodeNotDir     = client.CodeNotADirectory
	CodeNotRegular = client.CodeNotARegularFile
	CodeNotEmpty   = client.CodeDirectoryNotEmpty
	CodeInvalid    = client.CodeInvalidPath
	CodeDiskFull   = client.CodeDiskFull
	CodeReadOnly   = client.CodeReadOnly
	CodePermission = client.CodePermissionDenied
	CodeUnsafe     = client.CodeUnsafeArchive
	CodeBadArchive = client.CodeBadArchive
	CodeShortBody  = client.CodeShortBody
	CodeTooLarge   = client.CodeTooLarge
	CodeIO         = client.CodeIOError
)

// Error is a failure with its code.
type Error struct {
	Code string
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func fail(code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Failed turns an error into a failed Result.
func Failed(err error) Result {
	var fe *Error
	if errors.As(err, &fe) {
		return Result{Code: fe.Code, Message: fe.Msg}
	}
	return Result{Code: classify(err), Message: err.Error()}
}

// classify gives a system error its code.
func classify(err error) string {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		if errors.Is(err, fs.ErrNotExist) {
			return CodeNotFound
		}
		return CodeIO
	}
	switch errno {
	case syscall.ENOENT:
		return CodeNotFound
	case syscall.ENOTDIR:
		return CodeNotDir
	case syscall.EISDIR:
		return CodeIsDir
	case syscall.ENOSPC, syscall.EDQUOT:
		return CodeDiskFull
	case syscall.EROFS:
		return CodeReadOnly
	case syscall.EACCES, syscall.EPERM:
		return CodePermission
	case syscall.ENOTEMPTY, syscall.EEXIST:
		return CodeNotEmpty
	case syscall.ENAMETOOLONG, syscall.ELOOP, syscall.EINVAL:
		return CodeInvalid
	case syscall.EFBIG:
		return CodeTooLarge
	}
	return CodeIO
}

// MaxPath bounds a path (Linux's PATH_MAX).
const MaxPath = 4096

// CheckPath refuses a path the helper does not take: it must be absolute,
// without NUL bytes, at most MaxPath bytes. It returns the path cleaned.
func CheckPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fail(CodeInvalid, "a path is required")
	case len(p) > MaxPath:
		return "", fail(CodeInvalid, "the path is %d bytes long: at most %d", len(p), MaxPath)
	case strings.IndexByte(p, 0) >= 0:
		return "", fail(CodeInvalid, "the path has a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return "", fail(CodeInvalid, "path %q must be absolute (start with /)", p)
	}
	return path.Clean(p), nil
}

// NamesDir reports a path written as a directory, ending in / or /.: as
// the kernel resolves such a path (and as docker cp copies it), a symlink
// there is taken as the directory it leads to.
func NamesDir(p string) bool {
	return len(p) > 1 && (strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/."))
}

// notDir refuses p, written as a directory (NamesDir), when what clean
// (p cleaned, which drops that) leads to is there and is no directory: as
// the kernel's ENOTDIR, where the clean path alone would be the file. What
// is missing is left to the operation to say.
func notDir(p, clean string) error {
	if !NamesDir(p) {
		return nil
	}
	if fi, err := os.Stat(clean); err == nil && !fi.IsDir() {
		return fail(CodeNotDir, "%s is not a directory (%s names one)", clean, p)
	}
	return nil
}

// infoOf describes fi, found at p.
func infoOf(p string, fi fs.FileInfo) Info {
	in := Info{Name: fi.Name(), Path: p, Size: fi.Size(), Mode: unixMode(fi.Mode()), MTime: fi.ModTime().UTC()}
	if p == "/" {
		in.Name = "/"
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		in.Type = TypeDir
	case m&fs.ModeSymlink != 0:
		in.Type = TypeSymlink
		in.Link, _ = os.Readlink(p)
	case m&fs.ModeNamedPipe != 0:
		in.Type = TypeFIFO
	case m&fs.ModeSocket != 0:
		in.Type = TypeSocket
	case m&fs.ModeCharDevice != 0:
		in.Type = TypeChar
	case m&fs.ModeDevice != 0:
		in.Type = TypeBlock
	default:
		in.Type = TypeFile
	}
	if in.Type != TypeFile {
		in.Size = 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		in.UID, in.GID = int(st.Uid), int(st.Gid)
	}
	return in
}

// unixMode is m's permission bits with setuid, setgid and sticky as Unix
// numbers them.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// goMode is the inverse of unixMode.
func goMode(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// Stat describes the file at p (what a symlink points to, with follow).
func Stat(p string, follow bool) Result {
	raw := p
	p, err := CheckPath(p)
	if err == nil {
		err = notDir(raw, p)
	}
	if err != nil {
		return Failed(err)
	}
	stat := os.Lstat
	if follow {
		stat = os.Stat
	}
	fi, err := stat(p)
	if err != nil {
		return Failed(pathErr(p, err))
	}
	in := infoOf(p, fi)
	return Result{OK: true, Info: &in}
}

// pathErr says what failed at p in words for the user, keeping its code.
func pathErr(p string, err error) error {
	code := classify(err)
	switch code {
	case CodeNotFound:
		return fail(code, "%s: no such file or directory", p)
	case CodeNotDir:
		return fail(code, "%s: a component of the path is not a directory", p)
	case CodeTooLarge:
		return fail(code, "%s: past the largest file the filesystem holds", p)
	case CodeInvalid:
		return fail(code, "%s: %v", p, unwrapErrno(err))
	}
	return fail(code, "%s: %v", p, unwrapErrno(err))
}

func unwrapErrno(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

// DefaultListLimit is how many entries List returns when not told.
const DefaultListLimit = 10000

// List describes the entries of directory p, sorted by name, at most limit
// of them (Truncated says there were more).
func List(p string, limit int) Result {
	p, err := CheckPath(p)
	if err != nil {
		return Failed(err)
	}
	if limit <= 0 {
		limit = DefaultListLimit
	}
	fi, err := os.Stat(p)
	if err != nil {
		return Failed(pathErr(p, err))
	}
	if !fi.IsDir() {
		return Failed(fail(CodeNotDir, "%s is not a directory", p))
	}
	d, err := os.Open(p)
	if err != nil {
		return Failed(pathErr(p, err))
	}
	defer d.Close()
	res := Result{OK: true, Entries: []Info{}}
	size := 0 // of the answer's JSON: within what the host reads (MaxResultLine)
	for {
		ents, err := d.ReadDir(256)
		for _, e := range ents {
			if len(res.Entries) == limit {
				res.Truncated = true
				break
			}
			efi, ierr := e.Info()
			if ierr != nil {
				continue // gone meanwhile
			}
			in := infoOf(path.Join(p, e.Name()), efi)
			b, _ := json.Marshal(in)
			if size += len(b) + 1; size > MaxResultLine-64<<10 {
				res.Truncated = true
				break
			}
			res.Entries = append(res.Entries, in)
		}
		if res.Truncated || err == io.EOF {
			break
		}
		if err != nil {
			return Failed(pathErr(p, err))
		}
	}
	sortInfos(res.Entries)
	return res
}

// Remove removes p; a directory that is not empty only with recursive.
func Remove(p string, recursive bool) Result {
	raw := p
	p, err := CheckPath(p)
	if err == nil {
		err = notDir(raw, p)
	}
	if err != nil {
		return Failed(err)
	}
	if p == "/" {
		return Failed(fail(CodeInvalid, "refusing to remove the sandbox's root directory"))
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return Failed(pathErr(p, err))
	}
	if fi.IsDir() && recursive {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if err != nil {
		if classify(err) == CodeNotEmpty {
			return Failed(fail(CodeNotEmpty, "%s is a directory that is not empty: remove it recursively to remove what it holds", p))
		}
		return Failed(pathErr(p, err))
	}
	in := infoOf(p, fi)
	return Result{OK: true, Info: &in}
}

// WriteResult writes r as the protocol's JSON line, flushed when w is
// buffered: the reader waits for it before anything follows (the HTTP
// answer's headers), and what follows may be long in coming (Scan).
func WriteResult(w io.Writer, r Result) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err = w.Write(append(b, '\n')); err != nil {
		return err
	}
	if f, ok := w.(interface{ Flush() error }); ok {
		return f.Flush()
	}
	return nil
}

// MaxResultLine bounds the JSON line a reader of the helper takes (a list
// of DefaultListLimit entries fits; a sandbox could send more).
const MaxResultLine = 16 << 20

// ReadResult reads the protocol's JSON line from r. The helper runs inside
// a sandbox, so the line is hostile input: its length is bounded.
func ReadResult(r *bufio.Reader) (Result, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > MaxResultLine {
			return Result{}, fmt.Errorf("the files helper's answer is over %d bytes", MaxResultLine)
		}
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Result{}, fmt.Errorf("the files helper gave no answer: %w", err)
		}
	}
	var res Result
	if err := json.Unmarshal(line, &res); err != nil {
		return Result{}, fmt.Errorf("the files helper's answer is not JSON: %w", err)
	}
	if !res.OK && res.Code == "" {
		res.Code = CodeIO
	}
	return res, nil
}

// HelperCommand is the hidden shard verb that runs these operations; its
// first argument is one of the Op* names.
const HelperCommand = "files-helper"

// Operations of the helper.
const (
	OpStat   = "stat"
	OpList   = "list"
	OpGet    = "get"
	OpPut    = "put"
	OpRemove = "rm"
)
