"""Call a deployed toy-policy: ``python client.py`` (needs SEQUENCES_API_KEY and a running gateway).

toy-policy declares no contract, so ``predict()`` sends this dict as is and returns exactly
what its infer() returned: ``{"delta": [dx]}``.
"""
import sequence_ai

if __name__ == "__main__":
    with sequence_ai.connect("toy-policy") as policy:
        policy.wait_until_ready()   # a worker still starting (just deployed, or the gateway restarted)
        x = 0.0
        for _ in range(8):
            out = policy.predict({"state": [x], "target": [0.5]})
            x += out["delta"][0]
            print(f"x = {x:.3f}")
