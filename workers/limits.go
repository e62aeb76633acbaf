package workers

// encodingSlack is what a result's encoding may add besides base64: the
// http type's JSON envelope (status, URL, headers) and escapes.
const encodingSlack = 64 << 10

// WireLimit is the most bytes the work protocol carries for a request
// whose payload is at most maxPayload and whose result is at most
// maxResult raw bytes: the limits are of raw bytes, and a binary result
// encoded as base64 (the http type's body_b64) is a third larger, so the
// wire leaves room for that rather than refusing a result within its
// limit.
func WireLimit(maxPayload, maxResult int) int {
	return max(maxPayload, 4*((maxResult+2)/3)+encodingSlack)
}
