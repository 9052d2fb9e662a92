"""The fixes a stream's error messages name, in the words of the entry point that runs it:
Spark options for `spark.readStream` users, flags for `lance-cdf publish` (which has no
failOnDataLoss or mergeSchema flag, and whose checkpoint is `--checkpoint`).

`lance-cdf publish` passes the source option `entryPoint=publish`; anything else reads
Spark's vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

from lance_cdf.errors import KEEP_VERSIONS


@dataclass(frozen=True)
class Advice:
    """One entry point's words for the fixes the source's messages name."""

    new_checkpoint: str  # start over from an empty checkpoint
    restart: str  # restart, same checkpoint
    starting: str  # how the first version is named (its option or flag)
    skip_lost: str  # what to do when versions were cleaned up before the stream read them
    new_columns: str  # what to do when a version adds columns

    def starting_given(self, value: str) -> str:
        if not self.starting.startswith("--"):
            return f"{self.starting}={value}"
        return "--snapshot" if value == "snapshot" else f"{self.starting} {value}"


SPARK = Advice(
    new_checkpoint="start the query with a new checkpointLocation",
    restart="restart the query (same checkpoint)",
    starting="startingVersion",
    skip_lost=(
        "Set failOnDataLoss=false to skip them (their changes are lost to this stream), or "
        f"restart from a new checkpoint; keep more versions ({KEEP_VERSIONS}) so streams can "
        "catch up."
    ),
    new_columns="Restart the query (same checkpoint) to pick them up, or set mergeSchema=true "
    "to keep streaming without them.",
)

PUBLISH = Advice(
    new_checkpoint="give --checkpoint a new, empty directory",
    restart="rerun lance-cdf publish (same --checkpoint)",
    starting="--starting-version",
    skip_lost=(
        "Their changes cannot be published any more: a replica built from this topic would "
        "keep rows they deleted. Publish the table again with --snapshot from a new, empty "
        "--checkpoint directory to a new --topic, and rebuild the replica from that topic "
        f'(see README, "When things fail"); keep more versions ({KEEP_VERSIONS}) so '
        "publishing can catch up."
    ),
    new_columns="Rerun lance-cdf publish (same --checkpoint) to publish them (the schema "
    "registry must accept the new schema under the subject's compatibility rule).",
)


def advice_for(entry_point: str) -> Advice:
    return PUBLISH if entry_point == "publish" else SPARK
