package client

import "slices"

// The codes of the API's errors: Error.Code of every error answer (and of
// an error inside a stream). The server emits these and no others, the
// status after each is the one it answers with, and openapi.json lists
// them (the enum of Error.code); new codes may be added, so a program
// treats a code it does not know by its status.
const (
	// The codes of the classes of error: an error that has no code of its
	// own has its class's (see internal/errdefs).
	CodeInvalidArgument     = "invalid_argument"     // 400: the request is malformed or a value is out of range
	CodeUnauthenticated     = "unauthenticated"      // 401: no API key, or one that is not valid
	CodeForbidden           = "forbidden"            // 403
	CodeNotFound            = "not_found"            // 404: no such endpoint
	CodeConflict            = "conflict"             // 409
	CodeUnsupported         = "unsupported"          // 409: the provider cannot do it here, or an image that cannot run here
	CodeTooLarge            = "too_large"            // 413: an import's upload over --max-image-size; a file larger than the sandbox's filesystem holds
	CodeFailed              = "failed"               // 422: the request was fine, what it ran failed
	CodeTooManyRequests     = "too_many_requests"    // 429: too many failed API keys from one address
	CodeCanceled            = "canceled"             // 499: the client went away before the answer
	CodeInternal            = "internal"             // 500: a fault of the server, never the user's
	CodeUpstream            = "upstream"             // 502: something the server relays to (another node) answered badly
	CodeUnavailable         = "unavailable"          // 503: the server cannot do it now, and will again
	CodeTimeout             = "timeout"              // 504: what the request waited for did not come in time
	CodeInsufficientStorage = "insufficient_storage" // 507: the server's disk cannot hold it

	CodeAmbiguousName         = "ambiguous_name"          // 409: a name in more than one project, given with a key of every project
	CodeBadArchive            = "bad_archive"             // 400: a tar to unpack into a sandbox that is not one
	CodeBadNodeSignature      = "bad_node_signature"      // 401: a call from another node whose signature is not valid
	CodeBodyTooLarge          = "body_too_large"          // 413: a request body over 1 MiB
	CodeCheckpointExists      = "checkpoint_exists"       // 409: a checkpoint sent to a node that has it
	CodeCheckpointGone        = "checkpoint_gone"         // 409: what a resume or diff starts from was removed
	CodeCheckpointInUse       = "checkpoint_in_use"       // 409: an environment or a sandbox still needs the checkpoint
	CodeCheckpointNotFound    = "checkpoint_not_found"    // 404
	CodeClusterFull           = "cluster_full"            // 507: no node has the memory for the sandbox
	CodeClusterUnavailable    = "cluster_unavailable"     // 503: the cluster's etcd cannot be reached
	CodeCommandNotFound       = "command_not_found"       // 400: exec of a program that is not in the sandbox
	CodeDifferentImages       = "different_images"        // 400: a diff of sandboxes of different images
	CodeDirectoryNotEmpty     = "directory_not_empty"     // 409
	CodeDiskFull              = "disk_full"               // 507: the sandbox's disk is full
	CodeEnvironmentCopy       = "environment_copy"        // 409: an environment here is another node's copy
	CodeEnvironmentExists     = "environment_exists"      // 409: an environment sent to a node that has it
	CodeEnvironmentNotFound   = "environment_not_found"   // 404
	CodeExecFailed            = "exec_failed"             // 400: the program exists but could not be started
	CodeFileNotFound          = "file_not_found"          // 404: no such file in the sandbox
	CodeFilesHelperFailed     = "files_helper_failed"     // 422: the file operation in the sandbox failed
	CodeForkHookFailed        = "fork_hook_failed"        // 422: a fork's on-fork hook failed
	CodeFreezeTimeout         = "freeze_timeout"          // 504: a fork's or checkpoint's freeze passed its limit; the source thawed
	CodeGrantFailed           = "grant_failed"            // 502: a granted file could not be written into or removed from the sandbox
	CodeGrantNotFound         = "grant_not_found"         // 404
	CodeImageCopyMismatch     = "image_copy_mismatch"     // 422: another node's copy of an import is not the image the cluster records
	CodeImageInUse            = "image_in_use"            // 409
	CodeImageNotExportable    = "image_not_exportable"    // 409: an import that cannot be sent to another node
	CodeImageNotFound         = "image_not_found"         // 404: locally, or in the registry during a pull
	CodeImageShared           = "image_shared"            // 403: a project's key removes a pulled image, which every project shares
	CodeImageTooLarge         = "image_too_large"         // 413: an image over --max-image-size
	CodeInsufficientMemory    = "insufficient_memory"     // 507: the host's memory cannot admit the sandbox
	CodeInvalidImage          = "invalid_image"           // 422: an image to pull or import that is not a valid image
	CodeInvalidPath           = "invalid_path"            // 400: a path in a sandbox that is not a clean absolute path
	CodeInvalidState          = "invalid_state"           // 409: a state change the lifecycle does not allow
	CodeIOError               = "io_error"                // 422: reading or writing a file in the sandbox failed
	CodeIsADirectory          = "is_a_directory"          // 400
	CodeMissingScope          = "missing_scope"           // 403: the API key lacks a scope the operation needs
	CodeNameTaken             = "name_taken"              // 409
	CodeNoAddresses           = "no_addresses"            // 503: the sandbox network has no free address
	CodeNoNode                = "no_node"                 // 503: no node of the cluster is up
	CodeNoProject             = "no_project"              // 403: a key that belongs to no project, which can act in none
	CodeNodeFull              = "node_full"               // 507: the node asked for has not the memory for the sandbox
	CodeNodeNotFound          = "node_not_found"          // 404
	CodeNodeUnreachable       = "node_unreachable"        // 503: the node that holds it does not answer
	CodeNodesOnly             = "nodes_only"              // 403: a call only another node of the cluster may make
	CodeNotADirectory         = "not_a_directory"         // 400
	CodeNotARegularFile       = "not_a_regular_file"      // 400
	CodeNotClustered          = "not_clustered"           // 409: a cluster's call to a single host
	CodePathExists            = "path_exists"             // 409: a file grant's path holds what the grant did not write
	CodePathUnsafe            = "path_unsafe"             // 409: a directory on a file grant's path is a symlink or no directory
	CodePermissionDenied      = "permission_denied"       // 409: the sandbox's file modes do not allow it
	CodePolicyFailed          = "policy_failed"           // 500: a network policy could not be applied
	CodePolicyRefused         = "policy_refused"          // 400: a policy allows what the server's egress boundary refuses
	CodePortUnreachable       = "port_unreachable"        // 502: nothing answers on that port in the sandbox
	CodeProviderUnavailable   = "provider_unavailable"    // 409: no node has the provider
	CodeQuotaExceeded         = "quota_exceeded"          // 403: the project's quota does not allow it
	CodeReadOnly              = "read_only"               // 409: the file system in the sandbox is read-only there
	CodeRegistryDenied        = "registry_denied"         // 403: the registry refused access to the image
	CodeRegistryNotAllowed    = "registry_not_allowed"    // 403: a registry or address this server does not pull from
	CodeRegistryTimeout       = "registry_timeout"        // 504: a registry did not answer in time, or a pull passed --pull-timeout
	CodeRegistryUnreachable   = "registry_unreachable"    // 502: a registry cannot be reached, or failed
	CodeSandboxBusy           = "sandbox_busy"            // 409: the sandbox is creating, starting, stopping or removing
	CodeSandboxFrozen         = "sandbox_frozen"          // 409: during a fork's or checkpoint's freeze; try again
	CodeSandboxLimit          = "sandbox_limit"           // 409: the server's --max-sandboxes is reached
	CodeSandboxNotFound       = "sandbox_not_found"       // 404
	CodeSandboxNotRunning     = "sandbox_not_running"     // 409
	CodeSandboxRunning        = "sandbox_running"         // 409
	CodeSandboxUnreachable    = "sandbox_unreachable"     // 502: the agent inside the sandbox does not answer
	CodeSecretNotFound        = "secret_not_found"        // 404
	CodeServerStopping        = "server_stopping"         // 503: the server is shutting down (an exec stream's end, a WebSocket exec refused)
	CodeSessionHasCheckpoints = "session_has_checkpoints" // 409
	CodeSessionInUse          = "session_in_use"          // 409: the ledger session's sandbox still exists
	CodeSessionNotFound       = "session_not_found"       // 404
	CodeSessionUnusable       = "session_unusable"        // 409: the session's events cannot be resumed from
	CodeSetupFailed           = "setup_failed"            // 422: an environment's setup command failed
	CodeShortBody             = "short_body"              // 400: an upload shorter than its Content-Length
	CodeSnapshotGone          = "snapshot_gone"           // 409: the snapshot a diff starts from was removed
	CodeSnapshotNotFound      = "snapshot_not_found"      // 404
	CodeTokenNotFound         = "token_not_found"         // 404
	CodeTooManyConnections    = "too_many_connections"    // 429: the client's address holds --max-client-conns connections
	CodeUnsafeArchive         = "unsafe_archive"          // 400: a tar whose entries climb out of where it is unpacked
	CodeWrongNode             = "wrong_node"              // 409: a create for another node than this one
	CodeWrongProject          = "wrong_project"           // 403: a project's key names another project
)

// Codes this package makes itself for what no server answered; the server
// never sends them, and they are not in Codes.
const (
	CodeServerUnreachable = "server_unreachable" // 502 from PortProxy and ServerProxy: the server cannot be reached
	CodeStreamEnded       = "stream_ended"       // 502: an exec stream ended before the command's exit
)

// Codes is every code the server emits, sorted: the enum of Error.code in
// openapi.json, which tests keep equal to it.
var Codes = sortedCodes(
	CodeInvalidArgument, CodeUnauthenticated, CodeForbidden, CodeNotFound, CodeConflict, CodeUnsupported,
	CodeTooLarge, CodeFailed, CodeTooManyRequests, CodeCanceled, CodeInternal, CodeUpstream, CodeUnavailable,
	CodeTimeout, CodeInsufficientStorage,
	CodeAmbiguousName, CodeBadArchive, CodeBadNodeSignature, CodeBodyTooLarge, CodeCheckpointExists,
	CodeCheckpointGone, CodeCheckpointInUse, CodeCheckpointNotFound, CodeClusterFull, CodeClusterUnavailable,
	CodeCommandNotFound, CodeDifferentImages, CodeDirectoryNotEmpty, CodeDiskFull, CodeEnvironmentCopy,
	CodeEnvironmentExists, CodeEnvironmentNotFound, CodeExecFailed, CodeFileNotFound, CodeFilesHelperFailed,
	CodeForkHookFailed, CodeFreezeTimeout, CodeGrantFailed, CodeGrantNotFound, CodeImageCopyMismatch,
	CodeImageInUse, CodeImageNotExportable, CodeImageNotFound, CodeImageShared, CodeImageTooLarge,
	CodeInsufficientMemory, CodeInvalidImage, CodeInvalidPath, CodeInvalidState, CodeIOError, CodeIsADirectory,
	CodeMissingScope, CodeNameTaken, CodeNoAddresses, CodeNoNode, CodeNoProject, CodeNodeFull, CodeNodeNotFound,
	CodeNodeUnreachable, CodeNodesOnly, CodeNotADirectory, CodeNotARegularFile, CodeNotClustered,
	CodePathExists, CodePathUnsafe, CodePermissionDenied, CodePolicyFailed, CodePolicyRefused,
	CodePortUnreachable, CodeProviderUnavailable, CodeQuotaExceeded, CodeReadOnly, CodeRegistryDenied,
	CodeRegistryNotAllowed, CodeRegistryTimeout, CodeRegistryUnreachable, CodeSandboxBusy, CodeSandboxFrozen,
	CodeSandboxLimit, CodeSandboxNotFound, CodeSandboxNotRunning, CodeSandboxRunning, CodeSandboxUnreachable,
	CodeSecretNotFound, CodeServerStopping, CodeSessionHasCheckpoints, CodeSessionInUse, CodeSessionNotFound, CodeSessionUnusable,
	CodeSetupFailed, CodeShortBody, CodeSnapshotGone, CodeSnapshotNotFound, CodeTokenNotFound,
	CodeTooManyConnections, CodeUnsafeArchive, CodeWrongNode, CodeWrongProject,
)

// IsCode reports whether code is one the server emits.
func IsCode(code string) bool {
	_, found := slices.BinarySearch(Codes, code)
	return found
}

func sortedCodes(codes ...string) []string {
	slices.Sort(codes)
	return codes
}
