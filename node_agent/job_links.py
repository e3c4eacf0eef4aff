"""A job's network across nodes (the process runtime's sandboxed learners): per-node addresses
with plain routes between the nodes, no overlay.

A job whose learners span nodes gets a subnet of the cluster's job range (`--job-network`,
10.224.0.0/11 by default) of its own, the `JOB_PREFIX` block numbered by its learner uid's index
in `TRAINYARD_LEARNER_UIDS` (the uid is allocated in Postgres with the claim and is the job's
alone across the fleet while it runs, so no two running jobs share a block, and every node
computes the same block without a word). Its node of rank r holds host r + 1 of the block, so
every rank knows rank 0's address (MASTER_ADDR) before any learner starts.

On each of its nodes, the job's network namespace (`node_agent.job_netns`) gets a veth pair to
the node: `INSIDE` in the namespace with the job's address there (a /32) and an on-link route to
the job's block, nothing else; the node's end, `tyl<agent><index>`, with no address of its own,
answers ARP for the peers' addresses (proxy ARP) and forwards. The node routes the job's
address here to its veth, and each peer node's job address (/32) via that node's address
(`--node-address`, recorded with its lease): the nodes' addresses must be on one link, as a
GPU cluster's fabric is. Firewall, in chains of our own:

- `TRAINYARD-LINKS` (top of FORWARD, and of Docker's DOCKER-USER where it is): from the veth,
  only the job's own address to its addresses on the peer nodes; into it, only those to it;
  everything else from or to it dropped (other jobs, the node's other networks, the control
  plane, private and link-local ranges);
- `TRAINYARD-LINKS-IN` (top of INPUT): nothing from the veth reaches the node itself;
- `TRAINYARD-LINKS-OUT` (top of OUTPUT): nothing on the node (a networked tenant's learner in
  the node's own network, say) opens a connection into the veth.

No IPv6 address is made on either end (`addrgenmode none`), so there is no IPv6 path at all.
Learners cannot change any of this: the namespace belongs to the node's user namespace and a
learner holds no capability there (`node_agent.sandbox`). Everything goes with the job's last
learner on the node: the namespace takes the veth with it, and `JobLinks.sweep` takes the rules
and routes of veths that are gone (also those an agent that died left).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import TYPE_CHECKING

from node_agent import commands

if TYPE_CHECKING:
    # For its annotation alone: the port's vocabulary loads the database driver, which the
    # agent's pure planners (node_agent.reconcile) are tested without.
    from controlplane.agent_port.vocabulary import NodeAddress

log = logging.getLogger(__name__)

DEFAULT_RANGE = "10.224.0.0/11"
"""The cluster's job range: in the private 10/8, which the isolation rules keep every learner
out of (so no learner reaches a job's address but its own job's), away from Docker's 172.16/12."""
JOB_PREFIX = 27
"""A job's block: 32 addresses, hosts 1 to 30, so a job spans at most 30 nodes; 65536 blocks in
the default range, as many as the default `TRAINYARD_LEARNER_UIDS` has uids."""
INSIDE = "job0"
"""The job's interface in its namespace (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`)."""
VETH_PREFIX = "tyl"
ROUTE_PROTOCOL = "213"
"""The routing protocol number our routes carry (any the kernel leaves alone: above 4), by which
`sweep` finds them among the node's."""
FORWARD_CHAIN = "TRAINYARD-LINKS"
INPUT_CHAIN = "TRAINYARD-LINKS-IN"
OUTPUT_CHAIN = "TRAINYARD-LINKS-OUT"
CHAINS = ((FORWARD_CHAIN, "FORWARD"), (INPUT_CHAIN, "INPUT"), (OUTPUT_CHAIN, "OUTPUT"))
DOCKER_CHAIN = "DOCKER-USER"
"""Docker's chain for an operator's forwarding rules, where the Docker engine manages iptables."""
Rule = list[str]
_VETH = re.compile(r"\b(" + re.escape(VETH_PREFIX) + r"[0-9a-f]{12})\b")
_DEV = re.compile(r"\bdev (\S+)")


class LinkError(Exception):
    """The job's network across nodes cannot be planned or made; the message says why."""


@dataclass(frozen=True, slots=True)
class AddressPlan:
    """The cluster's job range, split in blocks of `JOB_PREFIX`, one per running job."""

    cluster: IPv4Network

    @classmethod
    def parse(cls, text: str) -> AddressPlan:
        """`text` as a network (ValueError naming what is wrong)."""
        cluster = IPv4Network(text, strict=True)
        if cluster.prefixlen > JOB_PREFIX:
            raise ValueError(f"{text} is smaller than one job's block (/{JOB_PREFIX})")
        return cls(cluster)

    def key(self, first_uid: int) -> str:
        """How a node with this range and learner uids from `first_uid` numbers jobs' blocks,
        recorded with its registration: a job spans only nodes whose keys are equal, since a
        node numbering otherwise would give the job another running job's addresses (whose
        nodes' rules would then let it in)."""
        return f"{self.cluster} from uid {first_uid}"

    @property
    def blocks(self) -> int:
        return 1 << (JOB_PREFIX - self.cluster.prefixlen)

    def block(self, index: int) -> IPv4Network:
        """The job's block; LinkError when the range has no block `index`."""
        if not 0 <= index < self.blocks:
            raise LinkError(
                f"job index {index} is outside the {self.blocks} blocks of {self.cluster}: "
                "give --job-network a range as large as the learner uids"
            )
        first = int(self.cluster.network_address) + (index << (32 - JOB_PREFIX))
        return IPv4Network((first, JOB_PREFIX))

    def address(self, index: int, node_rank: int) -> IPv4Address:
        """The job's address on its node of rank `node_rank`."""
        block = self.block(index)
        if not 0 <= node_rank < block.num_addresses - 2:
            raise LinkError(f"a job spans at most {block.num_addresses - 2} nodes")
        return block[node_rank + 1]


@dataclass(frozen=True, slots=True)
class Peer:
    """The job's address on another of its nodes, and that node's address (the next hop)."""

    address: IPv4Address
    via: IPv4Address


@dataclass(frozen=True, slots=True)
class JobLink:
    """One node's part of a job's network across nodes."""

    index: int
    block: IPv4Network
    address: IPv4Address
    """The job's address here."""
    peers: tuple[Peer, ...]

    @property
    def master(self) -> IPv4Address:
        """The job's address on its node of rank 0, rank 0's (MASTER_ADDR)."""
        return self.block[1]


def unlinked_because(
    nodes: Sequence[str], recorded: Mapping[str, NodeAddress], key: str
) -> str | None:
    """Why a job on `nodes` gets no network across them, as their registrations `recorded`
    them, or None when it does: every node gave its address, and each numbers jobs' blocks as
    this one does (`key`, `AddressPlan.key`). Every node of the job reads the same records, so
    all of them decide alike."""
    unaddressed = [node for node in nodes if node not in recorded]
    if unaddressed:
        return f"for want of the address of {', '.join(unaddressed)} (--node-address)"
    unlike = [node for node in nodes if recorded[node].job_plan != key]
    if unlike:
        plans = ", ".join(f"{node} ({recorded[node].job_plan or 'unknown'})" for node in unlike)
        return (
            f"{plans} number jobs' addresses otherwise than {key} (--job-network and "
            "TRAINYARD_LEARNER_UIDS must agree on every node)"
        )
    return None


def job_link(
    plan: AddressPlan, index: int, nodes: Sequence[str], node: str, addresses: Mapping[str, str]
) -> JobLink:
    """`node`'s part of the network of the job of `index` on `nodes` (in node-rank order), whose
    nodes' addresses are `addresses`; LinkError when one of them has none, or a bad one."""
    peers = []
    for rank, name in enumerate(nodes):
        if name == node:
            continue
        recorded = addresses.get(name)
        if recorded is None:
            raise LinkError(f"node {name} has no address recorded (its agent's --node-address)")
        try:
            via = IPv4Address(recorded)
        except ValueError as exc:
            raise LinkError(f"node {name}'s address {recorded!r} is not IPv4") from exc
        peers.append(Peer(plan.address(index, rank), via))
    return JobLink(
        index=index,
        block=plan.block(index),
        address=plan.address(index, nodes.index(node)),
        peers=tuple(peers),
    )


def veth_name(owner: str, index: int) -> str:
    """The node's end of the job's veth: 15 characters, a Linux interface name's most."""
    return f"{VETH_PREFIX}{owner[:8]}{index:04x}"


def forward_rules(veth: str, link: JobLink) -> list[Rule]:
    """`FORWARD_CHAIN`'s rules for one job's veth, in order: ACCEPT, not RETURN, so that a
    FORWARD policy of DROP (Docker's) does not drop what the job may send."""
    own = f"{link.address}/32"
    rules = [
        ["-i", veth, "-s", own, "-d", f"{peer.address}/32", "-j", "ACCEPT"] for peer in link.peers
    ]
    rules.append(["-i", veth, "-j", "DROP"])
    rules += [
        ["-o", veth, "-s", f"{peer.address}/32", "-d", own, "-j", "ACCEPT"] for peer in link.peers
    ]
    rules.append(["-o", veth, "-j", "DROP"])
    return rules


def rules(veth: str, link: JobLink) -> list[tuple[str, Rule]]:
    """Every rule of the job's veth, with its chain."""
    return [
        *((FORWARD_CHAIN, rule) for rule in forward_rules(veth, link)),
        (INPUT_CHAIN, ["-i", veth, "-j", "DROP"]),
        (OUTPUT_CHAIN, ["-o", veth, "-j", "DROP"]),
    ]


class JobLinks:
    """One agent's jobs' links on its node (its `owner` tag names its veths)."""

    def __init__(self, owner: str, ip: str, iptables: str | None) -> None:
        self._owner = owner
        self._ip = ip
        self._iptables = iptables
        # One change of the chains at a time (a job's link made while another's is swept).
        self._lock = asyncio.Lock()

    @classmethod
    def open(cls, owner: str, ip: str) -> JobLinks:
        return cls(owner, ip, shutil.which("iptables"))

    def veth(self, index: int) -> str:
        return veth_name(self._owner, index)

    async def connect(self, namespace: str, link: JobLink) -> None:
        """Give the job's namespace `namespace` its link: rules first (nothing passes before
        they are in), then the veth, addresses and routes. Idempotent: a link made for an
        earlier attempt of the job (other nodes, other addresses) is made again from nothing.
        LinkError when it cannot be (the caller removes the namespace and what is left)."""
        # Held throughout: a sweep meanwhile would take the rules of a veth not made yet.
        async with self._lock:
            await self._connect(namespace, link)

    async def _connect(self, namespace: str, link: JobLink) -> None:
        veth = self.veth(link.index)
        await self._unlink(veth)
        iptables = self._program()
        for chain, parent in CHAINS:
            if (await _iptables(iptables, "-S", chain)).code != 0:
                await _check(iptables, "-N", chain)
            if (await _iptables(iptables, "-C", parent, "-j", chain)).code != 0:
                await _check(iptables, "-I", parent, "1", "-j", chain)
        # Docker puts its jumps back at the top of FORWARD as it starts and as it makes a
        # network, and then accepts what its bridges send before our chain sees it: the chain
        # is jumped to from DOCKER-USER as well, which Docker keeps first and never edits.
        docker = (await _iptables(iptables, "-S", DOCKER_CHAIN)).code == 0
        if docker and (await _iptables(iptables, "-C", DOCKER_CHAIN, "-j", FORWARD_CHAIN)).code:
            await _check(iptables, "-I", DOCKER_CHAIN, "1", "-j", FORWARD_CHAIN)
        for chain, rule in rules(veth, link):
            await _check(iptables, "-A", chain, *rule)
        ip = self._ip
        # Made again from nothing (an earlier attempt's, on this node, had other peers).
        if (await commands.run(ip, "link", "show", veth)).code == 0:
            await self._run(ip, "link", "del", veth)
        await self._run(ip, "link", "add", veth, "type", "veth", "peer", INSIDE, "netns", namespace)
        await self._run(ip, "link", "set", veth, "addrgenmode", "none")
        await self._run(ip, "-n", namespace, "link", "set", INSIDE, "addrgenmode", "none")
        await _sysctl(f"net/ipv4/conf/{veth}/forwarding", "1")
        await _sysctl(f"net/ipv4/conf/{veth}/proxy_arp", "1")
        await _sysctl(f"net/ipv4/neigh/{veth}/proxy_delay", "0")  # no 0.8 s wait for a reply
        # No IPv6 on the node's end either (where the kernel has it): nothing reaches the
        # node's IPv6 stack from the job.
        await _sysctl(f"net/ipv6/conf/{veth}/disable_ipv6", "1", optional=True)
        await self._run(ip, "link", "set", veth, "up")
        await self._run(ip, "-n", namespace, "addr", "add", f"{link.address}/32", "dev", INSIDE)
        await self._run(ip, "-n", namespace, "link", "set", INSIDE, "up")
        # The job's block is on the link: its peers' addresses are asked for by ARP, which the
        # node's end answers for them (proxy ARP). No other route: nothing else is reachable.
        block = str(link.block)
        await self._run(ip, "-n", namespace, "route", "add", block, "dev", INSIDE, "scope", "link")
        tag = ("proto", ROUTE_PROTOCOL)
        await self._run(ip, "route", "replace", f"{link.address}/32", "dev", veth, *tag)
        for peer in link.peers:
            via = str(peer.via)
            await self._run(ip, "route", "replace", f"{peer.address}/32", "via", via, *tag)
            # The peers' packets to the job come in on the node's interface towards them.
            uplink = _DEV.search(await self._run(ip, "-o", "route", "get", via))
            if uplink is not None:
                await _sysctl(f"net/ipv4/conf/{uplink.group(1)}/forwarding", "1")

    async def sweep(self) -> None:
        """Remove the rules of this agent's veths that are gone (with their namespaces), and
        our routes into blocks that no veth on the node serves any more (whichever agent made
        them). Logged, not raised: the next sweep tries again."""
        try:
            # All of it under the lock: a link this agent makes meanwhile would otherwise have
            # its routes listed here but not its veth, and lose them. The routes are listed
            # before the veths: a route listed was made after its veth (as `_connect` makes
            # them), so another agent's link made meanwhile is served in `present` too.
            async with self._lock:
                listed = await self._run(self._ip, "-o", "route", "show", "proto", ROUTE_PROTOCOL)
                present = set(_VETH.findall(await self._run(self._ip, "-o", "link", "show")))
                for veth in await self._listed_veths():
                    if veth not in present:
                        await self._unlink(veth)
                routes = [(line.split()[0], _DEV.search(line)) for line in listed.splitlines()]
                served = {
                    _block_of(destination)
                    for destination, dev in routes
                    if dev is not None and dev.group(1) in present
                }
                for destination, _ in routes:
                    if _block_of(destination) not in served:
                        await self._run(
                            self._ip, "route", "del", destination, "proto", ROUTE_PROTOCOL
                        )
        except (LinkError, OSError, ValueError) as exc:
            log.warning("cannot sweep the jobs' links: %s", exc)

    async def _listed_veths(self) -> set[str]:
        if self._iptables is None:
            return set()
        found: set[str] = set()
        for chain, _ in CHAINS:
            done = await _iptables(self._iptables, "-S", chain)
            if done.code == 0:
                found.update(v for v in _VETH.findall(done.out) if v.startswith(self.veth(0)[:-4]))
        return found

    async def _unlink(self, veth: str) -> None:
        """Remove every rule of `veth` from our chains (whatever its link was)."""
        if self._iptables is None:
            return
        for chain, _ in CHAINS:
            done = await _iptables(self._iptables, "-S", chain)
            if done.code != 0:
                continue
            for line in done.out.splitlines():
                words = line.split()
                if words[:2] == ["-A", chain] and veth in words:
                    await _iptables(self._iptables, "-D", chain, *words[2:])

    def _program(self) -> str:
        if self._iptables is None:
            raise LinkError("iptables is not installed: apt-get install iptables")
        return self._iptables

    async def _run(self, program: str, *args: str) -> str:
        done = await commands.run(program, *args)
        if done.code != 0:
            command = " ".join(["ip", *args])
            raise LinkError(f"`{command}` failed (exit {done.code}): {done.err.strip()}")
        return done.out


async def _iptables(program: str, *args: str) -> commands.Finished:
    # -w: wait for the xtables lock, which the Docker engine takes too.
    return await commands.run(program, "-w", *args)


async def _check(program: str, *args: str) -> None:
    done = await _iptables(program, *args)
    if done.code != 0:
        command = " ".join(["iptables", *args])
        raise LinkError(f"`{command}` failed (exit {done.code}): {done.err.strip()}")


async def _sysctl(key: str, value: str, *, optional: bool = False) -> None:
    """Set a setting of the agent's network namespace (/proc/sys/net is the opener's);
    `optional`: one a kernel without it (IPv6 turned off) lacks, which is then left."""
    path = Path("/proc/sys") / key
    try:
        await asyncio.to_thread(path.write_text, value)
    except FileNotFoundError as exc:
        if not optional:
            raise LinkError(f"cannot set {key.replace('/', '.')}: no such setting") from exc
    except OSError as exc:
        raise LinkError(f"cannot set {key.replace('/', '.')} to {value}: {exc}") from exc


def _block_of(destination: str) -> IPv4Network:
    """The job block a route's destination (an address, or an address/32) lies in."""
    return IPv4Network((destination.split("/")[0], JOB_PREFIX), strict=False)


def parse_address(text: str) -> str:
    """A node's address as recorded: IPv4, normalised (ValueError when it is not one)."""
    return str(ipaddress.IPv4Address(text))
