"""lance_cdf.errors: every error says whether retrying it may help, and the hierarchy is
ordered by that."""

import inspect

from lance_cdf import errors
from lance_cdf.errors import LanceCdfError
from lance_cdf.ops.takeup import is_transient


def _classes() -> list[type[LanceCdfError]]:
    return [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, LanceCdfError)
    ]


def test_a_permanent_error_never_derives_from_a_retriable_one():
    for cls in _classes():
        for base in cls.__mro__[1:]:
            if isinstance(base, type) and issubclass(base, LanceCdfError) and base.retriable:
                assert cls.retriable, f"{cls.__name__} is permanent under {base.__name__}"


def test_the_outages_are_retriable_and_the_refusals_are_not():
    assert errors.KafkaUnavailableError.retriable
    assert errors.RegistryUnavailableError.retriable
    assert errors.StorageAccessError.retriable
    for refusal in (
        errors.RegistryRefusedError,
        errors.KafkaAuthorizationError,
        errors.StableRowIdsRequiredError,
        errors.TableNameError,
    ):
        assert not refusal.retriable
        assert not is_transient(refusal("no"))
    # the replicator's errors are not the publisher's
    assert not issubclass(errors.KafkaAuthorizationError, errors.PublishError)
    assert not issubclass(errors.RegistryRefusedError, errors.RegistryUnavailableError)


def test_a_refusal_raised_from_an_outage_is_transient_by_its_cause():
    try:
        try:
            raise errors.StorageAccessError("the store did not answer")
        except errors.StorageAccessError as cause:
            raise errors.LanceCdfError("the table could not be read") from cause
    except errors.LanceCdfError as exc:
        assert is_transient(exc)
