package aws

import (
	"errors"
	"fmt"

	"github.com/aws/smithy-go"

	"github.com/arbiter-serve/arbiter/replicas"
)

// EC2's error codes (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html)
// that mean "not here, not now": placement tries the next zone, then on-demand.
var capacityCodes = map[string]bool{
	"InsufficientInstanceCapacity":         true,
	"InsufficientHostCapacity":             true,
	"InsufficientReservedInstanceCapacity": true,
	"InsufficientCapacityOnOutpost":        true,
	"MaxSpotInstanceCountExceeded":         true,
	"SpotMaxPriceTooLow":                   true,
	// The instance type is not offered in the zone (RunInstances says "Unsupported").
	"Unsupported": true,
}

// Codes a retry cannot fix: the account's quota, or credentials that are refused.
var (
	quotaCodes = map[string]bool{"VcpuLimitExceeded": true, "InstanceLimitExceeded": true, "MaxSpotFleetRequestCountExceeded": true}
	authCodes  = map[string]bool{
		"AuthFailure": true, "UnauthorizedOperation": true, "InvalidClientTokenId": true, "SignatureDoesNotMatch": true,
		"OptInRequired": true, "Blocked": true, "ExpiredToken": true, "RequestExpired": true,
	}
)

// errorCode is EC2's code for err ("" if it is not an API error).
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// classify turns a launch's API error into what the control plane acts on: ErrNoCapacity
// for the zone and capacity it was refused in, a quota or credentials error said as such
// (the operator must act; retrying does not help), else the error with context.
func classify(err error, what string) error {
	code := errorCode(err)
	switch {
	case capacityCodes[code]:
		return fmt.Errorf("%s: %w: %v", what, replicas.ErrNoCapacity, err)
	case quotaCodes[code]:
		return fmt.Errorf("%s: the account's EC2 quota refuses it (%s); ask for more in the Service Quotas console: %w", what, code, err)
	case authCodes[code]:
		return fmt.Errorf("%s: AWS refused the credentials or the permission (%s); see deploy/aws/iam-policy.json for what the provider needs: %w", what, code, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// notFound reports EC2's answer for an instance id it does not know (yet, or any more).
func notFound(err error) bool { return errorCode(err) == "InvalidInstanceID.NotFound" }
