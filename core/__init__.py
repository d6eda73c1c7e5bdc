"""The ground floor: errors, settings models, policy-name rules and wire-format text helpers.

Nothing here imports any other package of the project; every other package may import it.
"""
