package sandbox

import (
	"testing"

	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/files"
	"github.com/useshards/shard/internal/store"
)

// TestStartError: an agent's refusal keeps its code only when an agent
// sends that code; the sandbox cannot make up the API's codes.
func TestStartError(t *testing.T) {
	tests := []struct {
		code     string
		wantKind errdefs.Kind
		wantCode string
	}{
		{"command_not_found", errdefs.KindInvalid, "command_not_found"},
		{"invalid_argument", errdefs.KindInvalid, "invalid_argument"},
		{"exec_failed", errdefs.KindInvalid, "exec_failed"},
		{"internal", errdefs.KindInternal, "internal"},
		{"name_taken", errdefs.KindInvalid, "exec_failed"},
		{"made_up", errdefs.KindInvalid, "exec_failed"},
		{"", errdefs.KindInvalid, "exec_failed"},
	}
	for _, tt := range tests {
		err := startError(proto.ErrorInfo{Code: tt.code, Message: "no"})
		wantAPICode(t, "agent code "+tt.code, err, tt.wantKind, tt.wantCode)
	}
}

// TestFileError: a files helper's failure keeps its code only when a
// helper sends that code.
func TestFileError(t *testing.T) {
	tests := []struct {
		code     string
		wantKind errdefs.Kind
		wantCode string
	}{
		{files.CodeNotFound, errdefs.KindNotFound, "file_not_found"},
		{files.CodeInvalid, errdefs.KindInvalid, "invalid_path"},
		{files.CodeNotDir, errdefs.KindInvalid, "not_a_directory"},
		{files.CodeReadOnly, errdefs.KindConflict, "read_only"},
		{files.CodeIO, errdefs.KindFailed, "io_error"},
		{files.CodeTooLarge, errdefs.KindTooLarge, "too_large"},
		{"sandbox_not_found", errdefs.KindFailed, "files_helper_failed"},
		{"made_up", errdefs.KindFailed, "files_helper_failed"},
	}
	f := link(&Service{}).Files()
	for _, tt := range tests {
		err := f.fileError(&store.Sandbox{Name: "py"}, files.Result{Code: tt.code, Message: "no"})
		wantAPICode(t, "helper code "+tt.code, err, tt.wantKind, tt.wantCode)
	}
}
