package errdefs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantKind Kind
		wantCode string
	}{
		{"plain error", errors.New("boom"), KindInternal, "internal"},
		{"classified", NotFound("sandbox_not_found", "sandbox x not found"), KindNotFound, "sandbox_not_found"},
		{"classified, wrapped", fmt.Errorf("stop x: %w", Conflict("sandbox_busy", "busy")), KindConflict, "sandbox_busy"},
		{"kind's own code", New(KindForbidden, "", "no"), KindForbidden, "forbidden"},
		{"Invalid", Invalid("bad"), KindInvalid, "invalid_argument"},
		{"Unsupported", Unsupported("not here"), KindUnsupported, "unsupported"},
		{"Upstream", Upstream("registry_unreachable", "registry down"), KindUpstream, "registry_unreachable"},
		{"Unavailable", Unavailable("node_unreachable", "node a is down"), KindUnavailable, "node_unreachable"},
		{"ENOSPC", &fs.PathError{Op: "write", Path: "/var/lib/shard/x", Err: syscall.ENOSPC}, KindNoSpace, "insufficient_storage"},
		{"ENOSPC, wrapped", fmt.Errorf("copy: %w", syscall.ENOSPC), KindNoSpace, "insufficient_storage"},
		{"canceled", context.Canceled, KindCanceled, "canceled"},
		{"canceled, wrapped", fmt.Errorf("list sandboxes: %w", context.Canceled), KindCanceled, "canceled"},
		{"canceled under an internal error", Wrap(KindInternal, "policy_failed", fmt.Errorf("apply: %w", context.Canceled)), KindCanceled, "canceled"},
		{"canceled under another class keeps it", Wrap(KindUpstream, "sandbox_unreachable", context.Canceled), KindUpstream, "sandbox_unreachable"},
		{"deadline", context.DeadlineExceeded, KindTimeout, "timeout"},
		{"deadline, wrapped", fmt.Errorf("read: %w", context.DeadlineExceeded), KindTimeout, "timeout"},
		{"deadline under a class keeps it", Wrap(KindInternal, "policy_failed", context.DeadlineExceeded), KindInternal, "policy_failed"},
		{"an internal error keeps its code", Wrap(KindInternal, "policy_failed", errors.New("nft")), KindInternal, "policy_failed"},
		{"a class wins over ENOSPC", Wrap(KindFailed, "disk_full", syscall.ENOSPC), KindFailed, "disk_full"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := KindOf(tt.err); got != tt.wantKind {
				t.Errorf("KindOf(%v) = %q, want %q", tt.err, got, tt.wantKind)
			}
			if got := CodeOf(tt.err); got != tt.wantCode {
				t.Errorf("CodeOf(%v) = %q, want %q", tt.err, got, tt.wantCode)
			}
		})
	}
}

// TestKindOfStatus: every kind's status reads back as a kind of the same
// status (409 is KindConflict's, also for KindUnsupported), so another
// node's error answer passes on unchanged; a status no kind has is not one.
func TestKindOfStatus(t *testing.T) {
	for _, k := range []Kind{KindInvalid, KindNotFound, KindConflict, KindUnsupported, KindForbidden, KindUnauth,
		KindTooLarge, KindFailed, KindNoSpace, KindTooMany, KindCanceled, KindInternal, KindUpstream, KindUnavailable, KindTimeout} {
		back, ok := KindOfStatus(Status(k))
		if !ok || Status(back) != Status(k) {
			t.Errorf("%s's status %d reads back as %q (%v)", k, Status(k), back, ok)
		}
	}
	for _, status := range []int{200, 302, 418, 501} {
		if k, ok := KindOfStatus(status); ok {
			t.Errorf("KindOfStatus(%d) = %q, want none", status, k)
		}
	}
	if got := Status("no_such_kind"); got != 500 {
		t.Errorf("Status of an unknown kind = %d, want 500", got)
	}
}
