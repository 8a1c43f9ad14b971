"""AWS failures as one clear line each: a table from EC2 error codes to messages.

botocore raises ``ClientError`` with an error code (``InstanceLimitExceeded``, ``AuthFailure``...)
and a long message; :func:`explain` turns it into a :class:`ProvisionError` whose text says what
happened and what to do, filled in from the request's context (region, instance type, image).
Codes not in the table keep AWS's own message, still on one line.

Example:

    >>> from botocore.exceptions import ClientError
    >>> err = ClientError({"Error": {"Code": "InvalidAMIID.NotFound", "Message": "..."}},
    ...                   "RunInstances")
    >>> print(explain(err, {"image": "ami-0abc", "region": "eu-west-1"}))
    image ami-0abc does not exist in eu-west-1 (InvalidAMIID.NotFound)
"""

from __future__ import annotations

from collections.abc import Mapping

from poprun_py.errors import ProvisionError

_CREDENTIALS = (
    "AWS rejected the credentials ({code}): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
    "(or AWS_PROFILE)"
)

CLIENT_ERRORS: Mapping[str, str] = {
    "AuthFailure": _CREDENTIALS,
    "InvalidClientTokenId": _CREDENTIALS,
    "SignatureDoesNotMatch": _CREDENTIALS,
    "UnrecognizedClientException": _CREDENTIALS,
    "ExpiredToken": "the AWS session token has expired ({code}): get fresh credentials",
    "RequestExpired": "AWS says the request expired ({code}): check this machine's clock",
    "UnauthorizedOperation": (
        "not permitted to call {operation} in {region} ({code}): "
        "the IAM policy of these credentials lacks ec2:{operation}"
    ),
    "OptInRequired": "region {region} is not enabled for this account ({code})",
    "InvalidAMIID.NotFound": "image {image} does not exist in {region} ({code})",
    "InvalidAMIID.Malformed": "image id {image!r} is malformed: use ami-... or a name ({code})",
    "InvalidAMIID.Unavailable": "image {image} is no longer available in {region} ({code})",
    "InvalidInstanceType": "instance type {instance_type} does not exist in {region} ({code})",
    "InstanceLimitExceeded": (
        "instance quota reached: {region} allows this account no more {instance_type} "
        "instances ({code}); ask AWS to raise the limit or use fewer nodes"
    ),
    "VcpuLimitExceeded": (
        "vCPU quota reached for {market} {instance_type} in {region} ({code}); "
        "request a higher quota in Service Quotas or use fewer nodes"
    ),
    "MaxSpotInstanceCountExceeded": (
        "spot instance quota reached in {region} ({code}); use on-demand or fewer nodes"
    ),
    "InsufficientInstanceCapacity": (
        "AWS has no {market} capacity for {instance_type} in {region} right now ({code}); "
        "retry later or choose another instance type"
    ),
    "SpotMaxPriceTooLow": "the spot price for {instance_type} is above the maximum ({code})",
    "Unsupported": "{instance_type} cannot be used this way in {region} ({code}): {message}",
    "InvalidKeyPair.NotFound": "key pair {key_name} does not exist in {region} ({code})",
    "DependencyViolation": "{operation} failed: still in use ({code}): {message}",
}


class _Fill(dict[str, str]):
    """format_map helper: a missing field prints as '?' instead of raising."""

    def __missing__(self, key: str) -> str:
        return "?"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def error_code(exc: BaseException) -> str:
    """The EC2 error code of a botocore ClientError (``""`` for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


def explain(exc: BaseException, context: Mapping[str, str]) -> ProvisionError:
    """A one-line ProvisionError for a botocore ClientError raised by an EC2 call."""
    code = error_code(exc)
    response = getattr(exc, "response", {}) or {}
    message = _one_line(str(response.get("Error", {}).get("Message", "")) or str(exc))
    operation = str(getattr(exc, "operation_name", "") or context.get("operation", "?"))
    fill = _Fill(context)
    fill.update(code=code or "?", message=message, operation=operation)
    template = CLIENT_ERRORS.get(code)
    if template is None:
        return ProvisionError(_one_line(f"AWS {operation} failed ({code or 'error'}): {message}"))
    return ProvisionError(_one_line(template.format_map(fill)))


def explain_botocore(exc: BaseException, context: Mapping[str, str]) -> ProvisionError:
    """A one-line ProvisionError for botocore's own errors (credentials, endpoint, region)."""
    from botocore import exceptions as bce

    region = context.get("region", "?")
    if isinstance(exc, bce.NoCredentialsError | bce.PartialCredentialsError):
        return ProvisionError(
            "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE)"
        )
    if isinstance(exc, bce.ProfileNotFound):
        return ProvisionError(_one_line(f"AWS profile not found: {exc}"))
    if isinstance(exc, bce.NoRegionError):
        return ProvisionError("no AWS region: set provider.region in the spec or AWS_REGION")
    if isinstance(exc, bce.EndpointConnectionError):
        return ProvisionError(
            _one_line(f"cannot reach EC2 in {region}: {exc} (does the region exist?)")
        )
    if isinstance(exc, bce.ClientError):
        return explain(exc, context)
    return ProvisionError(_one_line(f"AWS error in {region}: {exc}"))


def as_provision_error(exc: BaseException, context: Mapping[str, str]) -> ProvisionError:
    """Any boto3/botocore failure as a one-line ProvisionError."""
    return explain(exc, context) if error_code(exc) else explain_botocore(exc, context)
