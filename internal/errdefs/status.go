package errdefs

import "net/http"

// StatusClientClosed is the status of a request whose client went away
// before its answer (nginx's 499): nobody reads it, but the access log and
// the metrics tell it from a failure of the server.
const StatusClientClosed = 499

// statuses is the HTTP status of each kind, the one table both ways read:
// the API answers an error with its kind's status (Status), and a node of a
// cluster reads another node's error answer back into its kind
// (KindOfStatus), so the error passes on as it was.
var statuses = []struct {
	kind   Kind
	status int
}{
	{KindInvalid, http.StatusBadRequest},
	{KindNotFound, http.StatusNotFound},
	{KindConflict, http.StatusConflict}, // first of 409: KindOfStatus's
	{KindUnsupported, http.StatusConflict},
	{KindForbidden, http.StatusForbidden},
	{KindUnauth, http.StatusUnauthorized},
	{KindFailed, http.StatusUnprocessableEntity},
	{KindTooLarge, http.StatusRequestEntityTooLarge},
	{KindNoSpace, http.StatusInsufficientStorage},
	{KindTooMany, http.StatusTooManyRequests},
	{KindCanceled, StatusClientClosed},
	{KindInternal, http.StatusInternalServerError},
	{KindUpstream, http.StatusBadGateway},
	{KindUnavailable, http.StatusServiceUnavailable},
	{KindTimeout, http.StatusGatewayTimeout},
}

// Status is the HTTP status of kind k (500 for a kind it does not know).
func Status(k Kind) int {
	for _, s := range statuses {
		if s.kind == k {
			return s.status
		}
	}
	return http.StatusInternalServerError
}

// KindOfStatus is the kind whose status is status (409 is KindConflict,
// the code telling an unsupported one), and false for a status no kind
// has.
func KindOfStatus(status int) (Kind, bool) {
	for _, s := range statuses {
		if s.status == status {
			return s.kind, true
		}
	}
	return "", false
}
