// Package errdefs holds the few error classes that shard maps to API codes.
//
// Every layer wraps with context (fmt.Errorf("sandbox %q: %w", name, err));
// the API maps the class once, in internal/api. The message a user sees is
// the error's text: write it for the user.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/useshards/shard/client"
)

// Kind is an error class. Each kind has an HTTP status in internal/api.
type Kind string

const (
	KindInvalid     Kind = client.CodeInvalidArgument     // 400: the request is malformed
	KindNotFound    Kind = client.CodeNotFound            // 404
	KindConflict    Kind = client.CodeConflict            // 409: the state does not allow it
	KindUnsupported Kind = client.CodeUnsupported         // 409: the provider cannot do this here
	KindForbidden   Kind = client.CodeForbidden           // 403
	KindUnauth      Kind = client.CodeUnauthenticated     // 401
	KindTooLarge    Kind = client.CodeTooLarge            // 413
	KindFailed      Kind = client.CodeFailed              // 422: the request was fine, what it ran failed
	KindNoSpace     Kind = client.CodeInsufficientStorage // 507: the server's disk (or memory) cannot hold it
	KindTooMany     Kind = client.CodeTooManyRequests     // 429: the client is over a rate limit
	KindCanceled    Kind = client.CodeCanceled            // 499: the client went away; not the server's failure, never logged as one
	KindInternal    Kind = client.CodeInternal            // 500: our fault, never the user's
	// KindUpstream (502): something the server relays to or depends on
	// (a registry, a sandbox's agent or port, another node's answer)
	// failed or answered badly.
	KindUpstream Kind = client.CodeUpstream
	// KindUnavailable (503): this server cannot do it now and will again
	// without the request changing (a node of the cluster or its etcd
	// is down, no free address); try again later.
	KindUnavailable Kind = client.CodeUnavailable
	// KindTimeout (504): what the request waited for (a registry, a
	// freeze, a deadline) did not come in time.
	KindTimeout Kind = client.CodeTimeout
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
	return New(KindInvalid, "", format, args...)
}
func NotFound(code, format string, args ...any) error {
	return New(KindNotFound, code, format, args...)
}
func Conflict(code, format string, args ...any) error {
	return New(KindConflict, code, format, args...)
}
func Unsupported(format string, args ...any) error {
	return New(KindUnsupported, "", format, args...)
}
func Upstream(code, format string, args ...any) error {
	return New(KindUpstream, code, format, args...)
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

// classify is err's class and code. An error classified nowhere in its
// chain is internal, but for what is not the server's fault: a full disk
// (ENOSPC), a client that went away (context.Canceled) and a deadline that
// passed (context.DeadlineExceeded). An internal error whose cause is a
// cancellation is a cancellation too: a request the client left is never
// the server's failure.
func classify(err error) (Kind, string) {
	e, ok := As(err)
	if ok && e.Kind != KindInternal {
		return e.Kind, e.Code
	}
	switch {
	case errors.Is(err, context.Canceled):
		return KindCanceled, string(KindCanceled)
	case ok:
		return e.Kind, e.Code
	case errors.Is(err, context.DeadlineExceeded):
		return KindTimeout, string(KindTimeout)
	case errors.Is(err, syscall.ENOSPC):
		return KindNoSpace, string(KindNoSpace)
	}
	return KindInternal, string(KindInternal)
}

// KindOf reports err's class (see classify).
func KindOf(err error) Kind {
	k, _ := classify(err)
	return k
}

// CodeOf reports err's code (see classify).
func CodeOf(err error) string {
	_, c := classify(err)
	return c
}

// Is reports whether err has the given kind.
func Is(err error, kind Kind) bool { return KindOf(err) == kind }
