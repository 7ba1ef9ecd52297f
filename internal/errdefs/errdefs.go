// Package errdefs holds the few error classes that shard maps to API codes.
//
// Every layer wraps with context (fmt.Errorf("sandbox %q: %w", name, err));
// the API maps the class once, in internal/api. The message a user sees is
// the error's text: write it for the user.
package errdefs

import (
	"errors"
	"fmt"
	"syscall"
)

// Kind is an error class. Each kind has an HTTP status in internal/api.
type Kind string

const (
	KindInvalid     Kind = "invalid_argument"  // 400: the request is malformed
	KindNotFound    Kind = "not_found"         // 404
	KindConflict    Kind = "conflict"          // 409: the state does not allow it
	KindUnsupported Kind = "unsupported"       // 409: the provider cannot do this here
	KindUnavailable Kind = "unavailable"       // 502: a dependency is not reachable
	KindUnreachable Kind = "unreachable"       // 503: a node of the cluster (or its etcd) is not reachable; try again later
	KindForbidden   Kind = "forbidden"         // 403
	KindUnauth      Kind = "unauthenticated"   // 401
	KindTooLarge    Kind = "too_large"         // 413
	KindFailed      Kind = "failed"            // 422: the request was fine, what it ran failed
	KindNoSpace     Kind = "no_space"          // 507: the server's disk cannot hold it
	KindTooMany     Kind = "too_many_requests" // 429: the client is over a rate limit
	KindInternal    Kind = "internal"          // 500: our fault, never the user's
)

// Error is a classified error with a specific code (e.g. "name_taken").
// Code defaults to the kind's name.
type Error struct {
	Kind Kind
	Code string
	Msg  string
	Err  error // optional cause, kept for errors.Is/As and logs
}

func (e *Error) Error() string {
	if e.Msg != "" {
		return e.Msg
	}
	if e.Err != nil {
		return e.Err.Error()
	}
	return string(e.Kind)
}

func (e *Error) Unwrap() error { return e.Err }

// New makes a classified error with a code and a user-facing message.
func New(kind Kind, code, format string, args ...any) error {
	if code == "" {
		code = string(kind)
	}
	return &Error{Kind: kind, Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Wrap classifies err, keeping its text as the message.
func Wrap(kind Kind, code string, err error) error {
	if err == nil {
		return nil
	}
	if code == "" {
		code = string(kind)
	}
	return &Error{Kind: kind, Code: code, Msg: err.Error(), Err: err}
}

// Invalid, NotFound, Conflict ... are shorthands for New.
func Invalid(format string, args ...any) error {
	return New(KindInvalid, "invalid_argument", format, args...)
}
func NotFound(code, format string, args ...any) error {
	return New(KindNotFound, code, format, args...)
}
func Conflict(code, format string, args ...any) error {
	return New(KindConflict, code, format, args...)
}
func Unsupported(format string, args ...any) error {
	return New(KindUnsupported, "unsupported", format, args...)
}
func Unavailable(code, format string, args ...any) error {
	return New(KindUnavailable, code, format, args...)
}

// As returns the classified error in err's chain, if any.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// KindOf reports err's class; unclassified errors are internal, but for a
// full disk (ENOSPC anywhere in the chain), which is the server's state and
// not its fault.
func KindOf(err error) Kind {
	if e, ok := As(err); ok {
		return e.Kind
	}
	if errors.Is(err, syscall.ENOSPC) {
		return KindNoSpace
	}
	return KindInternal
}

// CodeOf reports err's code; unclassified errors are "internal" (or
// "insufficient_storage" for ENOSPC).
func CodeOf(err error) string {
	if e, ok := As(err); ok {
		return e.Code
	}
	if errors.Is(err, syscall.ENOSPC) {
		return "insufficient_storage"
	}
	return string(KindInternal)
}

// Is reports whether err has the given kind.
func Is(err error, kind Kind) bool { return KindOf(err) == kind }
