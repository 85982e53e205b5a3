"""What the generated reference says that the code cannot say by itself: one description per
environment variable and per error code, and the short introductions of the generated pages.

``scripts/gen_reference.py`` renders these beside what it reads from the code, and refuses to
render when the two disagree: a variable found in the source with no entry in :data:`ENV_VARS`,
an entry for a variable the source no longer mentions, or an error code of
``sequence_ai_core.protocol.ERROR_CODES`` without a note in :data:`ERROR_NOTES` (or a note for a
code that is gone). ``test/unit/test_docs.py`` runs it, so adding a variable or a code means adding
its line here.
"""

#: ``(group, title, introduction)`` in page order
ENV_GROUPS = (
    ("client", "Client and robot side",
     "Read by the robot client (`sequence_ai`, `sequence_ai_core`), the `sequence-ai` command line, "
     "the ROS 2 nodes and the MCP server. An argument given in code or on the command line wins over "
     "the variable."),
    ("server", "Gateway (`seq serve`)",
     "Read once when the gateway starts (`sequence_ai_server.common.config.ServerConfig`, unless noted); the "
     "gateway hands its environment on to the workers it starts, so a worker setting set here "
     "reaches every worker. A site proxy (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`) is never used "
     "between the gateway and its workers (`common/plain_http.py`), whatever `NO_PROXY` says."),
    ("worker", "Worker",
     "Read by a worker process (`python -m sequence_ai_server.worker`). A gateway sets the ones "
     "marked *set by the gateway* itself for each worker it starts; set the others in the "
     "gateway's environment."),
    ("scripts", "Scripts and tests",
     "Read by the shell scripts in `scripts/` and by the test set-up; none of them changes what the "
     "product does."),
)

ENV_INTRO = ("Every environment variable the code reads, found by scanning the source for the "
             "`SEQ_`, `SEQUENCES_`, `SEQUENCE_AI_` and `SEQAI_` prefixes; `test/unit/test_docs.py` fails "
             "when a name is found that this table does not describe, or the table describes one the "
             "code no longer has. Durations are in seconds and sizes in bytes unless a row says "
             "otherwise. The last column names up to three files that mention the variable.")

#: name -> (group, default, what it does)
ENV_VARS = {
    # ---- client and robot side
    "SEQUENCES_API_KEY": ("client", "none",
                          "The API key the client, `seq` and `sequence-ai` send (`Authorization: Bearer`). "
                          "`connect(api_key=...)` / `--api-key` win over it; `seq` falls back to "
                          "`<data_dir>/api_key`, the client library never reads that file. The ROS driver "
                          "reads the variable its `api_key_env` parameter names (this one by default)."),
    "SEQUENCES_GATEWAY_URL": ("client", "http://127.0.0.1:8470",
                              "The gateway's URL for every client: the library, both command lines, the "
                              "driver (its `gateway_url` parameter wins) and the MCP server."),
    "SEQUENCES_HOME": ("client", "~/.sequence-ai",
                       "The data directory: the gateway's state (`state.db`, `api_key`, logs, versions, "
                       "volumes, captured episodes) and the key `sequence-ai bag export` signs its "
                       "exports with. `seq serve --data-dir` wins on the server side."),
    "SEQ_CLIENT_DOOR": ("client", "1",
                        "`0` keeps a client's channel to a worker on a loopback address on its websocket; by "
                        "default both channels move to the worker's same-host door (a Unix socket: no websocket "
                        "framing between the robot and the policy; docs/design.md, the same-host door): the sync "
                        "`predict()`'s blocking channel and the asyncio channel of `AsyncPolicy` and `run()` / "
                        "`act()` (the ROS driver's control loop)."),
    "SEQUENCE_AI_TRANSPORT": ("client", "auto",
                              "How `/act` travels when `connect(transport=...)` is not given: `auto` (the "
                              "websocket channel when the `websockets` package is installed and the "
                              "worker has one, else HTTP), `http` or `channel`."),
    "SEQUENCES_CHAT_BASE_URL": ("client", "none",
                                "Base URL of the OpenAI-compatible endpoint `sequence_ai.chat()` and "
                                "`decide()` call when no `base_url=` is given."),
    "SEQUENCES_CHAT_API_KEY": ("client", "none",
                               "Key for the `chat()` / `decide()` endpoint when no `api_key=` is given (keep it as a `seq secret` "
                               "for code the gateway runs)."),
    "SEQUENCES_CHAT_PRICES": ("client", "none",
                              "`IN,OUT` prices in USD per million tokens, for `cost_usd` when the provider "
                              "reports no cost; unset: `cost_usd` is None."),
    "SEQUENCES_MCP_TOKEN": ("client", "none",
                            "Bearer token `sequence-ai mcp --http` requires from its clients; needed to bind "
                            "any address but loopback (read from the environment so it never shows in `ps`)."),
    # ---- gateway
    "SEQ_LEASE_TTL_S": ("server", "300",
                        "Lifetime of a session's lease (s); clients renew before it lapses."),
    "SEQ_MAX_GPUS": ("server", "no cap",
                     "Most workers that may run at once, each local worker counting as one card; a connect "
                     "that would start one more is refused `gpu_limit_reached`."),
    "SEQ_CPU_WORKERS": ("server", "the machine's core count",
                        "Most workers one CPU policy (`gpu=\"cpu\"` or none) may run at once; its `max_gpus` "
                        "counts its workers (undeclared: 1), up to this."),
    "SEQ_HEALTH_INTERVAL_S": ("server", "2",
                              "How often the gateway pings serving workers for a jammed inference (s)."),
    "SEQ_PING_TIMEOUT_S": ("server", "5",
                           "How long one of the gateway's health pings may take (s); an alive worker that "
                           "answers none for two of them (and two pings in a row) is jammed and replaced."),
    "SEQ_HEADER_TIMEOUT_S": ("server", "10",
                             "How long a connection to the gateway or a worker may take to send a request's "
                             "headers (s, in [0.5, 3600]); past it the answer is 408 and the connection is closed. "
                             "Bounds slow-header (slowloris) connections; a websocket, once open, is not timed."),
    "SEQ_GATEWAY_MAX_BODY_BYTES": ("server", "33554432 (32 MiB)",
                                   "Largest request body the gateway reads; a larger one is 413 "
                                   "`payload_too_large` before it is read."),
    "SEQ_BACKEND": ("server", "local",
                    "Where workers run: `local` (subprocesses) or `ray` (Ray actors). `seq serve --backend` "
                    "sets it."),
    "SEQ_RAY_ADDRESS": ("server", "local",
                        "The Ray cluster for `--backend ray`; `local` starts a private loopback head. "
                        "`seq serve --ray-address` sets it."),
    "SEQ_RAY_GPUS_PER_NODE": ("server", "8",
                              "Cards in one machine of a Ray cluster; a policy asking for more becomes a "
                              "placement group of whole machines. A whole number >= 1."),
    "SEQ_ALERT_BACKOFF_S": ("server", "0.5,1,2,4",
                            "Comma-separated waits (s) before each retry of a webhook delivery."),
    "SEQ_FAKE_GPUS": ("server", "unset (the machine's cards: NVML, else nvidia-smi)",
                      "Card names the gateway presents instead of the machine's, numbered from 0 "
                      "(`L4,L4,H100`; `NAME=GiB` gives a card's memory); workers are pinned to them as "
                      "to real cards. For tests and CPU machines."),
    "SEQ_MAX_UNKEPT_LABELS": ("server", "10000",
                              "Label files a deployment may hold for episodes that were not kept; one more "
                              "is 400 `invalid_request` (read when a label arrives)."),
    "SEQ_VOLUME_MAX_BYTES": ("server", "2**53",
                             "Largest volume version, all files together; it can only lower the built-in cap "
                             "(read at each upload)."),
    # ---- worker
    "SEQ_WORKER_MAX_BODY_BYTES": ("worker", "33554432 (32 MiB)",
                                  "Largest `/act` body (HTTP or one channel message); a larger one is 413 "
                                  "`payload_too_large`. `--max-body-bytes` wins."),
    "SEQ_WORKER_FORK": ("server", "on",
                        "The local launcher forks each worker from the gateway's fork server, a process that "
                        "imported the worker's web stack once (on a 2-core VM: start to ready 0.51-0.56 -> "
                        "0.25-0.35 s, a worker's CPU 0.45 -> 0.19 s). `0` starts every worker as a new "
                        "interpreter. A worker whose environment differs from the gateway's in a variable read "
                        "only at exec (`LD_*`, `PYTHON*`, `LC_*`, `LANG`, `TZ`, `MALLOC_*`, `GLIBC_TUNABLES`), "
                        "an image worker, or one whose command line is over 8 KiB starts as a new interpreter "
                        "anyway; its log says why."),
    "SEQ_WORKER_INLINE": ("worker", "off",
                          "`1` serves a cheap policy's requests (median under 0.5 ms) on the worker's event-loop "
                          "thread instead of its replica's: 0.1-0.3 ms less per request, but a call that hangs "
                          "then stalls `/ping` and every other robot until the gateway replaces the worker. "
                          "`--inline` / `--no-inline` win."),
    "SEQ_WORKER_MAX_CONNECTIONS": ("worker", "64",
                                   "Open websockets (the `/act` channels and openpi connections together) a "
                                   "worker accepts; one more upgrade is 503 `too_many_connections`. A whole "
                                   "number >= 1; `--max-connections` wins."),
    "SEQ_WORKER_MODE": ("worker", "serve",
                        "`serve` (never waits to fill a `@seq.batched` batch beyond `serve_wait_ms`) or "
                        "`eval` (gathers requests until `eval_wait_ms` of quiet, a full batch, or 250 ms). "
                        "`--mode` wins."),
    "SEQ_EPISODE_IDLE_S": ("worker", "300",
                           "An episode without a request for this long is ended and `@seq.on_episode` runs (s)."),
    "SEQ_CAPTURE_DIR": ("worker", "set by the gateway: <data_dir>/capture/<name>",
                        "Where the worker keeps sampled episodes (`seq policy capture`); unset: nothing is kept."),
    "SEQ_CAPTURE_POLL_S": ("worker", "2",
                           "How often the capture writer re-reads the deployment's capture settings (s)."),
    "SEQ_GATEWAY_URL": ("worker", "set by the gateway",
                        "The gateway that started the worker: the worker fetches its declared secrets from "
                        "it and polls it for ended sessions. Unset (a worker run by hand): neither."),
    "SEQ_REVOCATION_POLL_S": ("worker", "1",
                              "How often a worker asks its gateway for sessions ended early (s)."),
    "SEQ_WORKER_SECRET": ("worker", "none",
                          "The worker's direct secret, instead of `--secret` (keeps it out of `ps`)."),
    "SEQ_WORKER_SECRET_FILE": ("worker", "set by the gateway",
                               "File (0600) holding the worker's current secret; re-read when it changes, "
                               "so `seq policy rotate-secret` takes effect at once."),
    "SEQ_WORKER_ACTIVITY_FILE": ("worker", "set by the gateway",
                                 "File the worker touches on each accepted request; its modification time is "
                                 "what the idle stop and an orphaned worker's own stop read."),
    "SEQ_JSON_LOG": ("worker", "set by the gateway: <data_dir>/logs/<name>.jsonl",
                     "The worker's structured JSON log (`seq policy logs`); unset: no JSON log."),
    "SEQ_DEPLOYMENT_VERSION": ("worker", "set by the gateway",
                               "The deployment version the worker serves, written into each JSON log line."),
    "SEQ_VOLUMES_DIR": ("worker", "set by the gateway: <data_dir>/volumes",
                        "Where `weights=\"vol://NAME@vN\"` is looked up."),
    "SEQ_GROUP_JOIN_S": ("worker", "300",
                         "How long a member of a Ray group waits for the others to join `torch.distributed` (s)."),
    # ---- scripts and tests
    "SEQAI_ROOT": ("scripts", "set by scripts/env.sh",
                   "The repository root, exported by `. scripts/env.sh`."),
    "SEQAI_ROS_DOMAIN_DEFAULT": ("scripts", "set by scripts/env.sh",
                                 "The checkout's own `ROS_DOMAIN_ID` (1..100, from its path), which "
                                 "`. scripts/env.sh` exports as `ROS_DOMAIN_ID` unless one is set, so every "
                                 "shell of the checkout shares a domain; `scripts/demo.sh` and the tests "
                                 "(`test/conftest.py`) move off it to a domain of their own."),
    "SEQAI_ROS_EXTRAS": ("scripts", "../shared/ros-jazzy-extras",
                         "Folder of the ROS 2 wheels PyPI lacks (launch, launch_ros, the `ros2` CLI, "
                         "composition_interfaces) that `scripts/bootstrap.sh` installs without a ROS install. "
                         "Keep it outside a colcon workspace's `src/`."),
    "SEQAI_PROFILE": ("scripts", "test",
                      "What `scripts/bootstrap.sh` installs when no profile argument is given: `demo` (what "
                      "the demo runs) or `test` (the demo's and everything the suite needs)."),
    "SEQAI_FORCE": ("scripts", "0",
                    "`1`: `scripts/bootstrap.sh` redoes its installs and builds even when their stamps match."),
    "SEQAI_IN_LOOPBACK_NS": ("scripts", "set inside the namespace",
                             "`1` inside `scripts/in_loopback_ns.sh`'s loopback-only namespace, so a nested "
                             "call runs its command directly."),
    "SEQAI_LEROBOT_VENV": ("scripts", "build/lerobot-venv",
                           "Side venv of `scripts/lerobot_conformance.sh` (lerobot reads our exports there)."),
    "SEQAI_PY312": ("scripts", "~/.pyenv/versions/3.12*/bin/python3.12, else python3.12",
                    "The Python 3.12 interpreter `scripts/lerobot_conformance.sh` builds that venv with."),
    "SEQ_BENCH_ROS_KEY": ("scripts", "set by the bench",
                          "The API key `bench/bench_ros_nodes.py` hands the driver processes it starts "
                          "(it serves its own gateway and sets this itself)."),
    "SEQ_TEST_WORKERS": ("scripts", "2",
                         "pytest-xdist workers of `scripts/test.sh`; `0` runs the suite serially."),
}

ERRORS_INTRO = ("Every error a gateway or worker answers has one JSON shape, with an HTTP status per "
                "code and an `X-Request-ID` header; the client turns it into one of the exception "
                "classes below (`sequence_ai_core._errors.from_response`). The table is "
                "`sequence_ai_core.protocol.ERROR_CODES`, which server and client both read. "
                "`details` carries the specifics a code's row mentions (`reason`, `phase`, `param`, ...).")

ERROR_SHAPE = """
{"detail": str, "code": str, "retryable": bool, "retry_after_s": float | null,
 "request_id": str | null, "hint": str | null, "details": object | null}
"""

#: code -> when it is answered
ERROR_NOTES = {
    "invalid_request": "Malformed body, an undeclared or badly typed inference parameter (`details.reason: params`), "
                       "an observation the contract cannot read, a NUL or lone surrogate in a JSON string "
                       "(`bad_string`), a delay beyond `max_delay_steps` (`delay_exceeded`, raised as "
                       "`DelayUnsupported`), a refused export target, a `PolicyInputError` from the policy.",
    "contract_mismatch": "The observation or the model's declaration is not what the caller expects "
                         "(raised before anything is sent, or an eval plan whose adapter does not fit).",
    "unauthorized": "Missing, wrong or revoked key; a robot key used outside its deployment "
                    "(`details.reason: key_bound`); a wrong direct secret; an ended session "
                    "(`session_ended`). Checked from the headers before any body is read.",
    "lease_expired": "A lease that lapsed, or one from a worker since replaced; the client reconnects by itself.",
    "out_of_credit": "A usage limit set on the gateway (self-hosted: no money is involved).",
    "quota_exceeded": "A limit set with `seq account limits` is reached (`details.reason: quota_reached`, with "
                      "`limit`, `scope`, `value`, `used`); open sessions run on.",
    "not_found": "Unknown deployment, model, volume, key, session or route.",
    "payload_too_large": "A body over the gateway's or the worker's limit (32 MiB by default), refused from "
                         "`Content-Length` before it is read.",
    "policy_error": "The policy's own code raised (`details.exception_type`, `remote_traceback`, `builtin`) or "
                    "returned a bad chunk (`details.reason`: `action_dim`, `shape`, `non_finite`, "
                    "`open_loop_horizon`, `action_space`, `bounds` under `on_violation=\"refuse\"`).",
    "internal": "A bug in the server itself, never the policy; the answer is complete and the keep-alive "
                "connection stays usable.",
    "warming": "The worker is loading; `Retry-After` (the last measured spawn-to-ready time, else 30 s) says "
               "when to ask again, `details.phase` how far it got.",
    "worker_failed": "The worker failed to load or died; `details` has the phase, exception and log tail.",
    "unavailable": "Not retryable as is: e.g. a channel already has 32 requests in flight, an upstream "
                   "(chat endpoint, gateway) failed, or no card is free for a worker (`details.reason` "
                   "`gpu_busy`: every card is held; `gpu_low_stock`: every card of the listed types is held "
                   "while another type is free).",
    "queued": "Every slot of a `@seq.concurrent` policy is taken and it queues (`on_full=\"queue\"`): "
              "`details.position`, `estimate_s`, `ticket`; connect again with the ticket after Retry-After.",
    "queue_timeout": "Waited `queue_timeout_s` in line without a slot.",
    "deployment_full": "Every slot is taken and the policy declares `on_full=\"reject\"`; or the deployment "
                       "already holds its `max_gpus` cards (`details.reason` `deployment_full`).",
    "deployment_stopped": "The deployment is under an emergency stop (`seq policy stop`) until `seq policy start`.",
    "gpu_limit_reached": "Starting one more worker would exceed `$SEQ_MAX_GPUS`.",
    "too_many_connections": "The worker's websocket places (64 by default) are all taken; `Retry-After: 1`, "
                            "`details.open` and `limit`. The `auto` client uses HTTP for 30 s.",
    "request_timeout": "One inference ran past the policy's `timeouts.request`; the worker finishes it.",
}

ROS_INTRO = ("The three nodes of the `sequence_ai` ROS 2 package, read from their code: each parameter as "
             "declared (default, range, description; `ros2 param describe NODE NAME` prints the same), "
             "and every publisher, subscription, service and action the node module creates. "
             "`takes effect`: `runtime` applies a change at once (or from the next goal), `configure` "
             "when the lifecycle node is next configured, `start` only at start. Parameter files are "
             "under `config/`, written under `/**:` keys so they apply in any namespace; see the "
             "[ROS 2 guide](../guides/ros.md).")

ROS_NODES = {
    "policy_driver": "The managed (lifecycle) node that connects to a deployed policy, turns the sensor topics "
                     "into observations, publishes the action chunks' rows at the policy's control frequency "
                     "and serves the `Act` action. Created at configure, from the parameters: one camera "
                     "subscription per `camera_topics` entry (message type per `camera_transports`), the "
                     "joint-state subscription, and the command publishers `command_mode` picks: "
                     "`command_topic` (type `command_type`), or `<arm_controller>/commands` "
                     "(forward_command_controller) / `<arm_controller>/joint_trajectory` "
                     "(joint_trajectory_controller), and the same under `gripper_controller` for "
                     "`gripper_output`. The lifecycle services (`~/change_state`, `~/get_state`, ...) are "
                     "rclpy's own.",
    "sim_robot": "The simulated Franka Panda pick-and-place cell (MuJoCo): publishes two camera views and the "
                 "joint state, takes joint-position commands (8 values: 7 joints in rad, the gripper 0..1), and offers reset and "
                 "success checks. Camera topics: `camera/exterior_1/image_raw` and `camera/wrist_left/image_raw`.",
    "episode_recorder": "Records one MCAP rosbag2 bag per episode, around each `Act` goal (`auto_record`) or "
                        "through its `RecordEpisode` action, and labels them. One camera subscription per "
                        "`camera_topics` entry (raw or compressed per `camera_transports`).",
}
