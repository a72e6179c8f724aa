use super::{place, Member, Placement};

fn member(outstanding: u32, slots: u32) -> Member {
    Member {
        eligible: true,
        outstanding,
        slots,
    }
}

#[test]
fn the_member_of_the_earlier_turn_keeps_the_conversation_within_the_imbalance() {
    let members = [member(3, 1), member(1, 1)];
    // 3 outstanding against 1: within an imbalance of 2.
    assert_eq!(
        place(&members, Some(0), 2, 7),
        (vec![0, 1], Placement::Affinity)
    );
    // Past an imbalance of 1: balanced, and said so.
    let (order, placement) = place(&members, Some(0), 1, 7);
    assert_eq!(placement, Placement::Overloaded);
    assert_eq!(
        order,
        vec![1, 0],
        "two choices of two members take the less loaded"
    );
}

#[test]
fn two_choices_take_the_less_loaded_per_slot_and_the_rest_follow_by_load() {
    // Member 1 has more requests but four slots: less loaded per slot.
    let members = [member(2, 1), member(3, 4), member(0, 1)];
    for draw in 0..64 {
        let (order, placement) = place(&members, None, 2, draw);
        assert_eq!(placement, Placement::Load);
        assert_eq!(order.len(), 3);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2], "every member once");
        // Never the most loaded when two are drawn from three; the rest by load.
        assert_ne!(order[0], 0, "draw {draw}: {order:?}");
        assert_eq!(&order[1..], if order[0] == 2 { &[1, 0] } else { &[2, 0] });
    }
    // Every pair of distinct members is drawn for some draw.
    let idle = [member(0, 1), member(0, 1), member(0, 1)];
    let firsts: std::collections::BTreeSet<usize> =
        (0..64).map(|d| place(&idle, None, 2, d).0[0]).collect();
    assert_eq!(firsts.len(), 3);
}

#[test]
fn members_that_cannot_take_it_come_last_and_one_left_is_the_only_choice() {
    let mut down = member(0, 1);
    down.eligible = false;
    let members = [down, member(5, 1)];
    // The earlier turn's member is down: the other serves, as the only choice.
    assert_eq!(
        place(&members, Some(0), 2, 3),
        (vec![1, 0], Placement::Only)
    );
    // None can: all are still tried, least loaded first.
    let mut busy_down = member(2, 1);
    busy_down.eligible = false;
    assert_eq!(
        place(&[busy_down, down], None, 2, 3),
        (vec![1, 0], Placement::Only)
    );
    // A preferred index out of range (a member removed by a reload) is no preference.
    assert_eq!(
        place(&[member(0, 1), member(1, 1)], Some(9), 2, 0).1,
        Placement::Load
    );
}
