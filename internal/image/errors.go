package image

import (
	"errors"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/useshards/shard/internal/errdefs"
)

// Errors the store returns reach users (the API answers with their text),
// so they never name a host path: where the store's own disk work fails,
// the message names the operation and the errno, and the path goes to the
// log.

// storeErr reports a failure of the store's own disk work, classed as
// errdefs classes err (internal, but for a full disk).
func (s *Store) storeErr(op string, err error) error {
	s.log.Error("image store failure", "op", op, "err", err)
	return &errdefs.Error{Kind: errdefs.KindOf(err), Code: errdefs.CodeOf(err),
		Msg: "the image store cannot " + op + ": " + errnoText(err), Err: err}
}

// errnoText is err without the paths a *fs.PathError, *os.LinkError or
// *os.SyscallError carries.
func errnoText(err error) string {
	var (
		pe *fs.PathError
		le *os.LinkError
		se *os.SyscallError
	)
	switch {
	case errors.As(err, &pe):
		return pe.Err.Error()
	case errors.As(err, &le):
		return le.Err.Error()
	case errors.As(err, &se):
		return se.Err.Error()
	}
	return err.Error()
}

// procFD matches the /proc/self/fd/N/ paths the unpacker works through.
var procFD = regexp.MustCompile(`/proc/self/fd/[0-9]+/?`)

// public makes sure err's text names no host path before a user sees it:
// each key of names found in it is replaced by its value (a temp dir by
// "", so that paths inside an archive read as the archive's own), and any
// path of the store's dir that is left by "<image store>". An error whose
// text changes keeps its class and code, and the full text is logged.
func (s *Store) public(err error, names map[string]string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	keys := make([]string, 0, len(names))
	for k := range names {
		if k != "" {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) }) // longest first
	clean := msg
	for _, k := range keys {
		clean = strings.ReplaceAll(clean, k, names[k])
	}
	clean = strings.ReplaceAll(clean, s.dir, "<image store>")
	clean = procFD.ReplaceAllString(clean, "")
	if clean == msg {
		return err
	}
	s.log.Warn("image error, shown without host paths", "err", msg)
	return &errdefs.Error{Kind: errdefs.KindOf(err), Code: errdefs.CodeOf(err), Msg: clean, Err: err}
}
